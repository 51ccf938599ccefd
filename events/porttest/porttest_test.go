package porttest

import (
	"net"
	"strconv"
	"testing"
)

// Free's ports are distinct, below the ephemeral range, and bindable.
func TestFree(t *testing.T) {
	ports, err := Free(6)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[int]bool{}
	top := ephemeralStart()
	for _, p := range ports {
		if seen[p] || p < lowest || p >= top {
			t.Fatalf("ports %v: want %d distinct ports in %d–%d", ports, len(ports), lowest, top-1)
		}
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			t.Fatalf("port %d: %v", p, err)
		}
		l.Close()
	}
}

// A port taken is never chosen.
func TestFreeSkipsTakenPorts(t *testing.T) {
	var held []net.Listener
	taken := map[int]bool{}
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	for range 200 {
		ports, err := Free(1)
		if err != nil {
			t.Fatal(err)
		}
		if taken[ports[0]] {
			t.Fatalf("port %d chosen while held", ports[0])
		}
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(ports[0]))
		if err != nil {
			t.Fatalf("port %d: %v", ports[0], err)
		}
		held = append(held, l)
		taken[ports[0]] = true
	}
}
