// Package porttest hands tests TCP ports on loopback for servers they
// start on a port of their choosing (PostgreSQL, etcd, an embedded NATS
// at a fixed address), such that nothing else takes the port between the
// test's choice and the server's bind.
//
// A port the kernel hands a listener bound to port 0 is in its ephemeral
// range, and once released it can become the source port of any
// process's next outgoing connection before the test's server binds it:
// a standby PostgreSQL of the pair suite once found its port taken that
// way. The kernel never hands out a port below that range on its own, so
// Free chooses there.
package porttest

import (
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
)

// lowest is the lowest port Free chooses: above the well-known and most
// registered services' ports.
const lowest = 20000

// ephemeralRange is where Linux reads the first port it may hand out on
// its own.
const ephemeralRange = "/proc/sys/net/ipv4/ip_local_port_range"

// Free returns n distinct TCP ports on 127.0.0.1 where nothing listened
// when it chose them (it binds them all at once, then lets them go),
// below the kernel's ephemeral range.
func Free(n int) ([]int, error) {
	top := ephemeralStart() // exclusive
	if top-lowest < 64*n {
		return nil, fmt.Errorf("porttest: the kernel's ephemeral ports start at %d (%s): too few ports below it from %d for %d", top, ephemeralRange, lowest, n)
	}
	var held []net.Listener
	defer func() {
		for _, l := range held {
			l.Close()
		}
	}()
	ports := make([]int, 0, n)
	for tries := 0; len(ports) < n; tries++ {
		if tries == 1000 {
			return nil, fmt.Errorf("porttest: no %d free ports among 1000 tried in %d–%d", n, lowest, top-1)
		}
		p := lowest + rand.IntN(top-lowest)
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		if err != nil {
			continue // taken
		}
		held = append(held, l)
		ports = append(ports, p)
	}
	return ports, nil
}

// ephemeralStart is the first port of the kernel's ephemeral range
// (32768 when it cannot be read: Linux's default).
func ephemeralStart() int {
	b, err := os.ReadFile(ephemeralRange)
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	p, err := strconv.Atoi(f[0])
	if err != nil || p <= 0 {
		return 32768
	}
	return p
}
