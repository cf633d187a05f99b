package cli

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// hostileAPI is an API server on loopback that answers every request with
// serve, and a kubeconfig that points at it.
func hostileAPI(t *testing.T, serve http.HandlerFunc) string {
	t.Helper()
	srv := httptest.NewServer(serve)
	t.Cleanup(func() {
		srv.CloseClientConnections()
		srv.Close()
	})
	path := filepath.Join(t.TempDir(), "kubeconfig")
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["hostile"] = &clientcmdapi.Cluster{Server: srv.URL}
	cfg.AuthInfos["me"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["hostile"] = &clientcmdapi.Context{Cluster: "hostile", AuthInfo: "me"}
	cfg.CurrentContext = "hostile"
	if err := clientcmd.WriteToFile(*cfg, path); err != nil {
		t.Fatal(err)
	}
	return path
}

// Issue 25, item 11: kubectl plugd cluster, node and doctor against an API
// server whose answers never end exit 1 and say what was wrong; against
// one that never answers, they end at --request-timeout.
func TestHostileAPI(t *testing.T) {
	endless := hostileAPI(t, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[`))
		chunk := []byte(strings.Repeat(`{"metadata":{"name":"x"}},`, 1024))
		for r.Context().Err() == nil {
			if _, err := w.Write(chunk); err != nil {
				return
			}
		}
	})
	silent := hostileAPI(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	for _, args := range [][]string{{"cluster"}, {"node", "a"}, {"doctor", "a"}} {
		code, out := run(append(args, "--kubeconfig", endless)...)
		if code != ExitError || !strings.Contains(out, "larger than 64 MiB, more than any answer plugd asks for (kubeconfig.MaxBody)") {
			t.Errorf("kubectl plugd %s against an endless answer: exit %d:\n%s", args[0], code, out)
		}
		t.Logf("kubectl plugd %s: %s", args[0], out)
		code, out = run(append(args, "--kubeconfig", silent, "--request-timeout", "1s")...)
		if code != ExitError || !strings.Contains(out, "did not answer in time; --request-timeout waits longer") {
			t.Errorf("kubectl plugd %s against a silent server: exit %d:\n%s", args[0], code, out)
		}
		t.Logf("kubectl plugd %s: %s", args[0], out)
	}
}
