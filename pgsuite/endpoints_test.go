package pgsuite

import (
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"testing"
	"time"
)

// httpAddr is the address site i's node serves HTTP on, from its ready line.
func (c *cluster) httpAddr(i int) string {
	c.t.Helper()
	s := c.sites[i]
	line, err := waitLine(s.log, s.logOffset, regexp.MustCompile(`msg=ready `), 10*time.Second, s.node)
	if err != nil {
		c.t.Fatalf("%s: no ready line: %v", s.name, err)
	}
	m := regexp.MustCompile(`http=(\S+)`).FindStringSubmatch(line)
	if m == nil {
		c.t.Fatalf("%s: no http address in %q", s.name, line)
	}
	return m[1]
}

// endpoint GETs path on addr: the status code and the body's reason.
func endpoint(addr, path string) (int, string, error) {
	cl := http.Client{Timeout: 2 * time.Second}
	resp, err := cl.Get("http://" + addr + path)
	if err != nil {
		return 0, "", err
	}
	defer resp.Body.Close()
	var body struct {
		Reason   string  `json:"reason"`
		Role     string  `json:"role"`
		LagBytes *uint64 `json:"lag_bytes"`
	}
	_ = json.NewDecoder(resp.Body).Decode(&body)
	return resp.StatusCode, fmt.Sprintf("role=%s reason=%q", body.Role, body.Reason), nil
}

// TestEndpoints: what a load balancer asks each node. On a healthy pair,
// /primary answers 200 on site-a only, /replica 200 on site-b only (and
// with ?lag= within a generous limit), /health 200 on both. After the kill
// of site-a's node, site-b's /primary answers 200 once it accepts writes,
// and never before.
func TestEndpoints(t *testing.T) {
	t.Parallel()
	c := newCluster(t, pairOptions{})
	c.start()
	a, b := c.httpAddr(0), c.httpAddr(1)
	want := func(addr, path string, code int, within time.Duration) {
		t.Helper()
		deadline := time.Now().Add(within)
		for {
			got, detail, err := endpoint(addr, path)
			if err == nil && got == code {
				return
			}
			if time.Now().After(deadline) {
				t.Fatalf("GET %s%s: %d (%s, err %v), want %d", addr, path, got, detail, err, code)
			}
			time.Sleep(50 * time.Millisecond)
		}
	}
	// The checks run every heartbeat: allow a few to report.
	want(a, "/primary", 200, 5*time.Second)
	want(b, "/replica", 200, 5*time.Second)
	want(b, "/replica?lag=104857600", 200, 5*time.Second)
	want(b, "/primary", 503, 0)
	want(a, "/replica", 503, 0)
	want(a, "/health", 200, 0)
	want(b, "/health", 200, 0)
	want(b, "/primary?lag=1", 400, 0)
	want(b, "/primary?pair=nosuch", 404, 0)
	m := c.startMonitor()
	killAt := time.Now()
	c.kill9(0)
	// Poll site-b's /primary; the first 200 must come when its database
	// accepts writes (the monitor's view), never before.
	var ok200 time.Time
	for time.Since(killAt) < 30*time.Second {
		code, _, err := endpoint(b, "/primary")
		if err == nil && code == 200 {
			ok200 = time.Now()
			break
		}
		time.Sleep(20 * time.Millisecond)
	}
	if ok200.IsZero() {
		t.Fatalf("site-b's /primary never answered 200 within 30s of site-a's kill:%s", m.timeline(1, killAt))
	}
	bw, ok := m.waitFor(1, stWritable, killAt, 5*time.Second)
	switch {
	case !ok:
		t.Fatalf("site-b's /primary answered 200 but the monitor never saw it accept writes:%s", m.timeline(1, killAt))
	case ok200.Before(bw.Add(-500 * time.Millisecond)):
		t.Errorf("site-b's /primary answered 200 %.0f ms before the monitor saw it accept writes", ms(bw.Sub(ok200)))
	}
	t.Logf("FIGURE endpoints primary_200_after_kill_ms=%.0f writable_after_kill_ms=%.0f", ms(ok200.Sub(killAt)), ms(bw.Sub(killAt)))
}
