// Package deploy tests what plugd ships for clusters, with the tools those
// files are made for: the Helm chart (charts/plugd) rendered and linted by
// Helm's own library, each object decoded strictly into its API type and
// plugd's configuration and flags checked by plugd itself (plugd
// --check-config); the files in deploy/kubernetes, which are the chart's
// renderings; and the monitoring mixin (deploy/monitoring), its rules
// parsed, evaluated and unit-tested by Prometheus's rule manager and
// PromQL engine, and its dashboard's queries checked against the metrics
// plugd's code exports. A module of its own, so that the main module never
// requires Helm or Prometheus. The chart's values.schema.json is held to
// plugd's configuration rules (testdata/config-rules.txt, written from
// cmd/plugd/internal/daemon/rules.go): each bad value is refused by the
// schema and by plugd --check-config, or by plugd alone for a reason
// listed in notInSchema; its README to values.yaml's comments. The
// release: release/package.sh's archives and release/image.sh's image
// (built without Docker, its config, platforms and binaries checked, run,
// rebuilt to the same digest, imported into a real containerd and run
// there), pushed with the chart to a registry on loopback
// (go-containerregistry's) and installed from it by Helm's library; the release workflow linted by actionlint's; the module used
// from a clone, as the docs say, before it is published.
//
// go test . -update renders the generated files again.
package deploy
