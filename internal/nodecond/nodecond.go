// Package nodecond is the form of the Node conditions plugd writes, for the
// node agent that writes them and the programs that read them back across
// a cluster (plugctl cluster): the message that names the plugin a
// condition is about, and a summary of a cluster's nodes by plugin. It
// knows Node objects as types only, so a reader links no client code.
package nodecond

import (
	"strings"

	corev1 "k8s.io/api/core/v1"

	"github.com/plugd/plugd/internal/textsafe"
)

// Prefix starts the message of every condition plugd writes, so that
// readers can tell them, and the plugin each is about, from others'.
const Prefix = "plugd: "

// FieldManager is who plugd's writes are from, in the objects'
// managedFields: a condition is plugd's when they say this manager set it.
const FieldManager = "plugd"

// MaxMessage bounds a condition's message: the kubelet's own are short, and
// every byte is in every Node read.
const MaxMessage = 512

// Message is a condition's message: which plugin, then why, escaped
// (textsafe: the text quotes API objects, and is read on terminals) and
// cut to MaxMessage bytes at a character boundary. It is what the API
// server stores: a message cut inside a character is not valid UTF-8, which
// the JSON of a write turns into U+FFFD, so the Node would never say what
// plugd wrote, and plugd would write it again at every look.
func Message(typ, name, text string) string {
	return textsafe.Shorten(Prefix+typ+" "+name+": "+text, MaxMessage)
}

// Parse tells the plugin a message of Message is about.
func Parse(m string) (typ, name string, ok bool) {
	rest, ok := strings.CutPrefix(m, Prefix)
	if !ok {
		return "", "", false
	}
	typ, rest, ok = strings.Cut(rest, " ")
	if !ok {
		return "", "", false
	}
	name, _, ok = strings.Cut(rest, ": ")
	return typ, name, ok && typ != "" && name != ""
}

// Resource is the type a resource's condition names in its message (an
// expect entry with anyOf): "plugd: anyOf gpu.example.com: ...".
const Resource = "anyOf"

// HeldBy starts the text of a True condition of a resource that several
// kinds of plugin may provide (an expect entry with anyOf): "held by TYPE
// NAME: ...", the plugin that makes it ready.
const HeldBy = "held by "

// Holder tells the plugin that holds a condition of a resource, from its
// message: ok is false for any other message.
func Holder(m string) (typ, name string, ok bool) {
	if t, _, ok := Parse(m); !ok || t != Resource {
		return "", "", false
	}
	_, rest, _ := strings.Cut(strings.TrimPrefix(m, Prefix), ": ")
	if rest, ok = strings.CutPrefix(rest, HeldBy); !ok {
		return "", "", false
	}
	typ, rest, ok = strings.Cut(rest, " ")
	if !ok {
		return "", "", false
	}
	name, _, ok = strings.Cut(rest, ": ")
	return typ, name, ok && typ != "" && name != ""
}

// Owned says whether c is a condition plugd writes.
func Owned(c corev1.NodeCondition) bool {
	_, _, ok := Parse(c.Message)
	return ok
}
