package unaryconn

// Peers that grpc-go's client talks to and unaryconn once did not (issue
// 12): each test here failed before the fix it is named after.

import (
	"testing"

	"golang.org/x/net/http2"
)

// TestHeaderTableSizeZero: a peer that sets SETTINGS_HEADER_TABLE_SIZE to 0,
// as nghttp2-based servers may, requires a dynamic table size update at the
// start of the first header block after it (RFC 7541 §4.2) and refuses the
// block with COMPRESSION_ERROR without one, as nghttp2 does.
func TestHeaderTableSizeZero(t *testing.T) {
	path := rawPeer(t, func(p *peer) {
		p.hello(http2.Setting{ID: http2.SettingHeaderTableSize, Val: 0})
		dec := p.fr.ReadMetaHeaders
		p.fr.ReadMetaHeaders = nil // to see the block as it was encoded
		for i := range 2 {
			var h *http2.HeadersFrame
			if !p.started {
				p.readPreface()
			}
			p.readUntil(func(f http2.Frame) bool { h, _ = f.(*http2.HeadersFrame); return h != nil })
			block := h.HeaderBlockFragment()
			if i == 0 && (len(block) == 0 || block[0] != 0x20) { // 001xxxxx: a size update, to 0
				p.t.Errorf("the first header block after SETTINGS_HEADER_TABLE_SIZE 0 begins with %#x, not a table size update to 0", block[:min(len(block), 1)])
				p.check(p.fr.WriteGoAway(0, http2.ErrCodeCompression, []byte("expected a dynamic table size update")))
				return
			}
			if _, err := dec.DecodeFull(block); err != nil {
				p.fatalf("decoding the request's headers: %v", err)
			}
			p.readData(h.StreamID)
			p.answer(h.StreamID, peerInfo)
		}
		p.drain()
	})
	c := dial(t, path)
	for i := range 2 {
		if _, err := info(c, wait, 1<<16); err != nil {
			t.Fatalf("call %d: %v", i, err)
		}
	}
}
