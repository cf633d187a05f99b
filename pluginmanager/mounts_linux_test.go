package pluginmanager

import "testing"

// mountsOn keeps the mounts on the way to the registry directory and below
// it, and nothing else.
func TestMountsOn(t *testing.T) {
	table := []byte(`22 1 0:21 / / rw,relatime shared:1 - ext4 /dev/root rw
23 22 0:22 / /var/lib rw shared:2 - ext4 /dev/sdb rw
24 23 0:23 / /var/lib/kubelet/pods/1/volumes/x rw - tmpfs tmpfs rw
25 23 0:24 /empty /var/lib/kubelet/plugins_registry/csi rw - ext4 /dev/sdb rw
26 23 0:25 / /var/lib/kubelet/plugins_registry\040old rw - tmpfs tmpfs rw
27 22 0:26 / /var/lib/kubelet/plugins_registry2 rw - tmpfs tmpfs rw
bad line
`)
	got := mountsOn(table, []string{"/var/lib/kubelet/plugins_registry"})
	want := "22 /\n23 /var/lib\n25 /var/lib/kubelet/plugins_registry/csi\n"
	if got != want {
		t.Errorf("mountsOn = %q, want %q", got, want)
	}
	if got := mountsOn(table, []string{"/var/lib/kubelet/plugins_registry old"}); got != "22 /\n23 /var/lib\n26 /var/lib/kubelet/plugins_registry old\n" {
		t.Errorf("mountsOn with an escaped mount point = %q", got)
	}
}
