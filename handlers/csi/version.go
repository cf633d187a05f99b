package csi

import (
	"fmt"

	utilversion "k8s.io/apimachinery/pkg/util/version"
)

// supportedMajor is the CSI major version plugd speaks. Every 1.x is
// compatible with 1.0 (the spec only adds to it), so any 1.x is accepted.
const supportedMajor = 1

// highestSupported picks the version of versions that the kubelet would, by
// the kubelet's own reading (k8s.io/apimachinery's HighestSupportedVersion):
// the highest 1.x among those with two or more numeric fields ("1.0.0",
// "1.2", "v1.5.0"; a suffix such as "-rc1" is ignored in comparisons). A
// registrar plugd accepts is one the kubelet accepts, and one it refuses
// ("1", "1.x") plugd refuses, so a plugin tested against plugd behaves the
// same beside the kubelet. raw is the entry as the driver wrote it, the last
// of equal ones, as the kubelet keeps the first it reads from the end.
func highestSupported(name string, versions []string) (raw string, v *utilversion.Version, err error) {
	v, err = utilversion.HighestSupportedVersion(versions)
	if err != nil {
		return "", nil, fmt.Errorf("CSI driver %q offers versions %q, none of which plugd supports: it supports CSI %d.x; %s",
			name, versions, supportedMajor, whyNone(versions))
	}
	for i := len(versions) - 1; i >= 0; i-- {
		if w, err := utilversion.ParseGeneric(versions[i]); err == nil && w.EqualTo(v) {
			return versions[i], v, nil
		}
	}
	// Not reached: v was read from one of versions.
	return v.String(), v, nil
}

// whyNone says why versions holds no version highestSupported takes: none
// is one at all, as the kubelet reads them (naming the first and why), or
// none of those that are is a 1.x.
func whyNone(versions []string) string {
	if len(versions) == 0 {
		return "it offers none"
	}
	var first error
	for _, s := range versions {
		_, err := utilversion.ParseGeneric(s)
		if err == nil {
			return fmt.Sprintf("none of them is a %d.x", supportedMajor)
		}
		if first == nil {
			first = err
		}
	}
	return fmt.Sprintf("none is a version as the kubelet reads them, two or more numbers such as \"1.0.0\", \"1.2\" or \"v1.5.0\" (%v)", first)
}
