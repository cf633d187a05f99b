package deviceplugin

import (
	"errors"
	"fmt"
	"strings"
	"unicode"

	"k8s.io/apimachinery/pkg/util/validation"

	"github.com/plugd/plugd/internal/textsafe"
)

const (
	maxSubdomainLen = 253
	maxNameLen      = 63
	// The kubelet checks a resource name as the quota name "requests.<name>",
	// so the domain has that much less room.
	quotaPrefix  = "requests."
	reservedZone = "kubernetes.io"
)

// checkResourceName says why name is not an extended resource name:
// domain/resource, the domain a DNS subdomain outside kubernetes.io, the
// resource a qualified name. The syntax is Kubernetes' own (apimachinery's
// validation, as the kubelet applies it); the shape and the reserved names
// are checked first, to say plainly what is wrong.
func checkResourceName(name string) error {
	domain, res, ok := strings.Cut(name, "/")
	switch {
	case !ok:
		return errors.New(`it has no domain: want "domain/resource", e.g. "vendor.example/gpu"`)
	case strings.Contains(res, "/"):
		return errors.New(`it has more than one "/": want "domain/resource"`)
	case domain == "":
		return errors.New("the domain is empty")
	case len(quotaPrefix)+len(domain) > maxSubdomainLen:
		return fmt.Errorf("the domain is %d bytes long, at most %d are allowed", len(domain), maxSubdomainLen-len(quotaPrefix))
	case len(validation.IsDNS1123Subdomain(domain)) > 0:
		return fmt.Errorf("domain %q is not a DNS subdomain: %s", domain, strings.Join(validation.IsDNS1123Subdomain(domain), "; "))
	case domain == reservedZone || strings.HasSuffix(domain, "."+reservedZone):
		return fmt.Errorf("domain %q is in the kubernetes.io namespace, which is reserved for native resources", domain)
	case strings.HasPrefix(domain, quotaPrefix):
		return fmt.Errorf("domain %q starts with %q, which is reserved for quota", domain, quotaPrefix)
	case res == "":
		return errors.New("the resource after the domain is empty")
	case len(res) > maxNameLen:
		return fmt.Errorf("the resource %q is %d bytes long, at most %d are allowed", res, len(res), maxNameLen)
	case len(validation.IsQualifiedName(res)) > 0:
		return fmt.Errorf("resource %q is not a qualified name: %s", res, strings.Join(validation.IsQualifiedName(res), "; "))
	}
	return nil
}

// checkDeviceID refuses IDs that would be awkward or unsafe to show and to
// store: empty, overlong, or with spaces or characters a terminal acts on.
func checkDeviceID(id string) error {
	if id == "" {
		return errors.New("empty device ID")
	}
	if len(id) > maxDeviceIDLen {
		return fmt.Errorf("device ID %.64q... is %d bytes long, at most %d are accepted", id, len(id), maxDeviceIDLen)
	}
	for _, r := range id {
		if r == unicode.ReplacementChar || !unicode.IsPrint(r) || unicode.IsSpace(r) {
			return fmt.Errorf("device ID %q has a character that is not printable or is a space", id)
		}
	}
	return nil
}

// maxErrorLen bounds an error kept in the state: a plugin chooses the
// messages of the gRPC errors it returns.
const maxErrorLen = 1024

// printable makes an error message, which may quote a plugin, safe to store
// and to show, cut to maxErrorLen bytes.
func printable(s string) string { return textsafe.Printable(s, maxErrorLen) }
