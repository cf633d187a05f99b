package kubeletstate

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"net"
	"net/netip"
	"os"
	"strconv"
)

// listenerUIDs are the owners of the TCP sockets listening at addr (its
// port, on its address or on every address) in plugd's network namespace,
// read from /proc/net/tcp and tcp6; local says there is at least one. A
// listener on [::] takes IPv4 connections too, and so counts for an IPv4
// address.
func listenerUIDs(addr net.Addr) ([]uint32, bool) {
	ta, ok := addr.(*net.TCPAddr)
	if !ok {
		return nil, false
	}
	ip, ok := netip.AddrFromSlice(ta.IP)
	if !ok {
		return nil, false
	}
	ip = ip.Unmap()
	var uids []uint32
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		uids = append(uids, listeners(f, ip, uint16(ta.Port))...)
	}
	return uids, len(uids) > 0
}

// tcpListen is the state of a listening socket in /proc/net/tcp.
const tcpListen = "0A"

// listeners reads the table at path for listening sockets on port, at ip
// or at the unspecified address, and returns their owners.
func listeners(path string, ip netip.Addr, port uint16) []uint32 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	var out []uint32
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		// sl local_address rem_address st tx:rx tr:when retrnsmt uid ...
		fields := bytes.Fields(sc.Bytes())
		if len(fields) < 8 || string(fields[3]) != tcpListen {
			continue
		}
		lip, lport, ok := parseProcAddr(string(fields[1]))
		if !ok || lport != port || !(lip.IsUnspecified() || lip == ip) {
			continue
		}
		if uid, err := strconv.ParseUint(string(fields[7]), 10, 32); err == nil {
			out = append(out, uint32(uid))
		}
	}
	return out
}

// parseProcAddr reads an address of /proc/net/tcp: the IP as 32-bit words
// in the host's byte order, in hex, a colon, the port in hex.
func parseProcAddr(s string) (netip.Addr, uint16, bool) {
	h, p, ok := bytes.Cut([]byte(s), []byte(":"))
	if !ok {
		return netip.Addr{}, 0, false
	}
	raw, err := hex.DecodeString(string(h))
	if err != nil || (len(raw) != 4 && len(raw) != 16) {
		return netip.Addr{}, 0, false
	}
	for i := 0; i < len(raw); i += 4 { // each word to network order
		binary.BigEndian.PutUint32(raw[i:], binary.NativeEndian.Uint32(raw[i:]))
	}
	port, err := strconv.ParseUint(string(p), 16, 16)
	if err != nil {
		return netip.Addr{}, 0, false
	}
	ip, _ := netip.AddrFromSlice(raw)
	return ip.Unmap(), uint16(port), true
}
