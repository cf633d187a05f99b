package fleet

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/plugd/plugd/internal/nodecond"
)

// A page of Nodes is read as the API server's protobuf, and only what the
// cluster view needs of each Node is decoded: its name, its conditions, its
// taints, and plugd's entries of its managedFields (which tell plugd's
// conditions from copies of their form).
// A real Node is mostly the images its kubelet lists and its managedFields;
// decoding them whole took more CPU than the API server took to send them
// (at 15,000 Nodes of 22 KB, 2.3 s of the command's 5 s).

// k8sProtobuf starts every protobuf answer of the API server.
var k8sProtobuf = []byte("k8s\x00")

// Field numbers of the messages read (k8s.io/api generated.proto).
const (
	unknownRaw           = 2  // runtime.Unknown.raw: the object
	listMetadata         = 1  // NodeList.metadata
	listItems            = 2  // NodeList.items
	listMetaContinue     = 3  // ListMeta.continue
	nodeMetadata         = 1  // Node.metadata
	nodeSpec             = 2  // Node.spec
	nodeSpecTaints       = 5  // NodeSpec.taints
	nodeStatus           = 3  // Node.status
	objectMetaName       = 1  // ObjectMeta.name
	objectMetaManaged    = 17 // ObjectMeta.managedFields
	managedFieldsManager = 1  // ManagedFieldsEntry.manager
	nodeStatusConditions = 4  // NodeStatus.conditions
)

// addPage adds the Nodes of one answer to a list of Nodes to c, and returns
// the list's continue token and how many Nodes it held. The answer is
// protobuf, or JSON from a server that does not speak protobuf.
func addPage(body []byte, contentType string, c *nodecond.Census) (string, int, error) {
	raw, ok := bytes.CutPrefix(body, k8sProtobuf)
	if !ok {
		var l corev1.NodeList
		if err := json.Unmarshal(body, &l); err != nil {
			return "", 0, fmt.Errorf("an answer of type %q that is not a list of Nodes: %w", contentType, err)
		}
		for i := range l.Items {
			c.Add(&l.Items[i])
		}
		return l.Continue, len(l.Items), nil
	}
	list, err := lastField(raw, unknownRaw)
	if err != nil {
		return "", 0, err
	}
	var cont string
	var nodes int
	err = eachField(list, func(num protowire.Number, v []byte) error {
		switch num {
		case listMetadata:
			s, err := lastField(v, listMetaContinue)
			cont = string(s)
			return err
		case listItems:
			n, err := nodeConditions(v)
			if err != nil {
				return err
			}
			c.Add(&n)
			nodes++
		}
		return nil
	})
	return cont, nodes, err
}

// continueToken is the continue token of an answer to a list of Nodes,
// read without decoding the Nodes (a JSON answer is decoded whole, once
// more: servers that answer JSON are not the ones with 15,000 Nodes).
func continueToken(body []byte) (string, error) {
	raw, ok := bytes.CutPrefix(body, k8sProtobuf)
	if !ok {
		var l metav1.List
		if err := json.Unmarshal(body, &l); err != nil {
			return "", fmt.Errorf("an answer that is not a list of Nodes: %w", err)
		}
		return l.Continue, nil
	}
	list, err := lastField(raw, unknownRaw)
	if err != nil {
		return "", err
	}
	meta, err := lastField(list, listMetadata)
	if err != nil {
		return "", err
	}
	cont, err := lastField(meta, listMetaContinue)
	return string(cont), err
}

// nodeConditions decodes a Node's name, conditions, taints and plugd's
// managedFields, and nothing else.
func nodeConditions(b []byte) (corev1.Node, error) {
	var n corev1.Node
	err := eachField(b, func(num protowire.Number, v []byte) error {
		switch num {
		case nodeMetadata:
			return eachField(v, func(num protowire.Number, v []byte) error {
				switch num {
				case objectMetaName:
					n.Name = string(v)
				case objectMetaManaged:
					// Only plugd's entries are decoded: the kubelet's are
					// most of the bytes.
					if m, err := lastField(v, managedFieldsManager); err != nil || string(m) != nodecond.FieldManager {
						return err
					}
					var mf metav1.ManagedFieldsEntry
					if err := mf.Unmarshal(v); err != nil {
						return err
					}
					n.ManagedFields = append(n.ManagedFields, mf)
				}
				return nil
			})
		case nodeSpec:
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num != nodeSpecTaints {
					return nil
				}
				var t corev1.Taint
				if err := t.Unmarshal(v); err != nil {
					return err
				}
				n.Spec.Taints = append(n.Spec.Taints, t)
				return nil
			})
		case nodeStatus:
			return eachField(v, func(num protowire.Number, v []byte) error {
				if num != nodeStatusConditions {
					return nil
				}
				var c corev1.NodeCondition
				if err := c.Unmarshal(v); err != nil {
					return err
				}
				n.Status.Conditions = append(n.Status.Conditions, c)
				return nil
			})
		}
		return nil
	})
	return n, err
}

// eachField calls fn with the number and bytes of each length-delimited
// field of the message b, in order; fields of other wire types are skipped.
func eachField(b []byte, fn func(protowire.Number, []byte) error) error {
	for len(b) > 0 {
		num, typ, n := protowire.ConsumeTag(b)
		if n < 0 {
			return errBadProtobuf
		}
		b = b[n:]
		if typ != protowire.BytesType {
			if n = protowire.ConsumeFieldValue(num, typ, b); n < 0 {
				return errBadProtobuf
			}
			b = b[n:]
			continue
		}
		v, n := protowire.ConsumeBytes(b)
		if n < 0 {
			return errBadProtobuf
		}
		if err := fn(num, v); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

// lastField is the last value of the length-delimited field num of the
// message b (protobuf's rule for a field that is not repeated), or nil.
func lastField(b []byte, num protowire.Number) ([]byte, error) {
	var out []byte
	err := eachField(b, func(n protowire.Number, v []byte) error {
		if n == num {
			out = v
		}
		return nil
	})
	return out, err
}

var errBadProtobuf = errors.New("the API server's protobuf answer is malformed")
