// Package kubeconfig finds the Kubernetes API server as kubectl does, from
// kubeconfig files read with a bound: plugd's kubernetes.kubeconfig and
// plugctl cluster's --kubeconfig are names an operator types, and
// /dev/zero, a FIFO or a stray log file in their place must be an error at
// once, not gigabytes read or a start that never ends. The clients built
// from what it finds bound the server's answers too (Bound).
package kubeconfig

import (
	"errors"
	"fmt"
	"io/fs"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/plugd/plugd/internal/smallfile"
)

// MaxSize bounds a kubeconfig file and each file it names (a certificate
// authority, a client certificate or key, a token). A kubeconfig with a
// thousand clusters, their certificates inline, is about 3 MiB.
const MaxSize = 4 << 20

// ClientConfig finds the API server as kubectl does: explicitPath if set,
// else the files in $KUBECONFIG, else ~/.kube/config, else the pod's
// in-cluster configuration; context picks a context of the kubeconfig
// ("" is its current one). Every kubeconfig file is checked with
// smallfile.Read, at most MaxSize, before client-go reads it; use
// RESTConfig to have the files it names checked too.
func ClientConfig(explicitPath, context string) clientcmd.ClientConfig {
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	rules.ExplicitPath = explicitPath
	// The migration copies a kubeconfig of a 2015 layout (~/.kube/.kubeconfig)
	// to ~/.kube/config, reading it whole.
	rules.MigrationRules = nil
	return clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loader{rules}, &clientcmd.ConfigOverrides{CurrentContext: context})
}

// RESTConfig is cc's client configuration, once the files it names are
// checked as the kubeconfig files are (client-go reads them at the first
// request, unbounded), with the bounds of Bound on what the clients built
// from it read and wait for.
func RESTConfig(cc clientcmd.ClientConfig) (*rest.Config, error) {
	rc, err := cc.ClientConfig()
	if err != nil {
		return nil, err
	}
	for _, f := range []struct{ what, path string }{
		{"certificate-authority", rc.TLSClientConfig.CAFile},
		{"client-certificate", rc.TLSClientConfig.CertFile},
		{"client-key", rc.TLSClientConfig.KeyFile},
		{"tokenFile", rc.BearerTokenFile},
	} {
		if f.path == "" {
			continue
		}
		if _, err := ReadFile(f.path, "a PEM file"); err != nil {
			return nil, fmt.Errorf("the kubeconfig's %s: %w", f.what, err)
		}
	}
	Bound(rc)
	return rc, nil
}

// ReadFile reads a file a configuration names beside a kubeconfig (a
// certificate authority such as plugd's kubernetes.kubelet.caFile) by the
// kubeconfig's rule: a regular file of at most MaxSize, opened without
// blocking (smallfile.Read). A refusal says what was refused and that want
// ("a PEM file") is what the path should name.
func ReadFile(path, want string) ([]byte, error) {
	b, err := smallfile.Read(path, MaxSize)
	if err != nil {
		return nil, explain(err, want)
	}
	return b, nil
}

// loader is client-go's loading rules, with each file checked first.
type loader struct {
	*clientcmd.ClientConfigLoadingRules
}

func (l loader) Load() (*clientcmdapi.Config, error) {
	for _, path := range l.GetLoadingPrecedence() {
		if path == "" {
			continue
		}
		_, err := smallfile.Read(path, MaxSize)
		var se *smallfile.Error
		switch {
		case err == nil, errors.Is(err, fs.ErrNotExist) && !l.IsExplicitFile():
			// A missing file in $KUBECONFIG is skipped, as kubectl skips it.
		case errors.As(err, &se):
			return nil, explain(err, "a kubeconfig file")
		default:
			return nil, fmt.Errorf("reading the kubeconfig: %w", err)
		}
	}
	return l.ClientConfigLoadingRules.Load()
}

// explain adds to smallfile's refusal what to do.
func explain(err error, want string) error {
	var se *smallfile.Error
	switch {
	case errors.As(err, &se) && se.Kind != "":
		return fmt.Errorf("%w: it is read whole; give the path of %s", err, want)
	case errors.As(err, &se):
		return fmt.Errorf("%w, more than %s holds: is it the right file?", err, want)
	}
	return err
}
