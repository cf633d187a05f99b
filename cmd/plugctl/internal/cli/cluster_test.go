package cli

import (
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/plugd/plugd/internal/testenv"
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

// endless answers with a list that never ends.
func endless(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Write([]byte(`{"kind":"NodeList","apiVersion":"v1","items":[`))
	chunk := []byte(strings.Repeat(`{"metadata":{"name":"x"}},`, 1024))
	for r.Context().Err() == nil {
		if _, err := w.Write(chunk); err != nil {
			return
		}
	}
}

// Issue 25, item 11: plugctl cluster against an API server whose list
// never ends, or that never answers, exits 1 and says what was wrong.
func TestClusterHostileAPI(t *testing.T) {
	// Reading 64 MiB takes 12 to 15 s under -race on 2 busy cores, more
	// than the default --timeout (10s): the bound under test is the size.
	run("cluster", "--kubeconfig", hostileAPI(t, endless), "--timeout", (3*testenv.Timeout).String()).want(t, ExitError, "larger than 64 MiB, more than any answer plugd asks for (kubeconfig.MaxBody)", "is this the API server?")
	silent := hostileAPI(t, func(w http.ResponseWriter, r *http.Request) { <-r.Context().Done() })
	run("cluster", "--kubeconfig", silent, "--timeout", "1s").want(t, ExitError, "did not answer within 1s")
}
