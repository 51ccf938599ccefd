package main

import (
	"bytes"
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// Status shows a pause with its reason and which members report it: the
// holder through the register, the other through its heartbeat.
func TestStatusShowsThePause(t *testing.T) {
	ctx := context.Background()
	at := time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC)
	kv := events.NewMemoryKV("understudy_failover", events.NewManualClock(at))
	put := func(key string, v []byte) uint64 {
		rev, err := kv.Put(ctx, key, v)
		if err != nil {
			t.Fatal(err)
		}
		return rev
	}
	put(failover.ConfigKey("pg"), failover.EncodeRules(failover.DefaultRules("pg", "site-a", "site-b")))
	rev := put(failover.PauseKey("pg"), failover.EncodePause(failover.Pause{ID: "p1", Paused: true, Reason: "kernel upgrade", At: at}))
	put(failover.LeaderKey("pg"), failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 1, Beat: 3, Paused: true, PauseRev: rev}))
	put(failover.HeartbeatKey("pg", "site-b"), failover.EncodeHeartbeat(failover.Heartbeat{Site: "site-b", Beat: 2, Phase: failover.PhaseFollower}))

	st, err := pairStatus(ctx, kv, "pg", at.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	if p := st.Pause; p == nil || !p.Paused || p.Reason != "kernel upgrade" || p.Rev != rev || !p.Seen["site-a"] || p.Seen["site-b"] {
		t.Fatalf("pause status %+v", st.Pause)
	}
	var out bytes.Buffer
	printStatus(&out, st)
	if !strings.Contains(out.String(), "pause    PAUSED since 2026-03-01T12:00:00Z (rev 2): kernel upgrade; no automatic failover; seen by site-a; NOT yet seen by site-b") {
		t.Errorf("printed:\n%s", out.String())
	}

	// Resumed and seen by both: nothing to say.
	rev = put(failover.PauseKey("pg"), failover.EncodePause(failover.Pause{ID: "p2", At: at}))
	put(failover.LeaderKey("pg"), failover.EncodeLeader(failover.Leader{Site: "site-a", Term: 1, Beat: 4, PauseRev: rev}))
	put(failover.HeartbeatKey("pg", "site-b"), failover.EncodeHeartbeat(failover.Heartbeat{Site: "site-b", Beat: 3, Phase: failover.PhaseFollower, PauseRev: rev}))
	st, err = pairStatus(ctx, kv, "pg", at.Add(time.Second))
	if err != nil {
		t.Fatal(err)
	}
	out.Reset()
	printStatus(&out, st)
	if st.Pause == nil || st.Pause.Paused || strings.Contains(out.String(), "pause ") {
		t.Errorf("resumed: %+v\n%s", st.Pause, out.String())
	}
}

// pause, status, failover --to against a live leader (refused by the
// target: use switchover), resume — on a node that hosts both members.
func TestPauseFailoverResumeCommands(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	const pair = "cli-pause"
	node := writeTestFile(t, dir, "node.yaml", `node: site-a
data_dir: `+filepath.Join(dir, "data")+`
nats: {listen: "127.0.0.1:0"}
http: 127.0.0.1:0
log: {format: json}
pairs:
`+pairMemberYAML(pair, "site-a")+pairMemberYAML(pair, "site-b"))
	_, ready := startServeBinary(t, "serve", "--config", node)
	url, _ := ready["client_url"].(string)
	st := waitLeader(t, url, pair, "site-a", 5*time.Second)

	code, stdout, stderr := runBinary(t, 20*time.Second, "pause", "--nats-url", url, "--pair", pair, "--reason", "kernel upgrade")
	if code != exitOK || !strings.Contains(stdout, "pair "+pair+" paused") || !strings.Contains(stdout, "seen by site-a and site-b") {
		t.Fatalf("pause: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if p := statusOf(t, url, pair)[0].Pause; p == nil || !p.Paused || p.Reason != "kernel upgrade" || !p.Seen["site-a"] || !p.Seen["site-b"] {
		t.Errorf("status after pause: %+v", p)
	}

	code, stdout, stderr = runBinary(t, 20*time.Second, "failover", "--nats-url", url, "--pair", pair, "--to", "site-b", "--wait", "10s")
	if code != exitFailure || !strings.Contains(stderr, "refused by site-b") || !strings.Contains(stderr, "use understudy switchover") {
		t.Errorf("failover to a member while the leader lives: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if after := waitLeader(t, url, pair, "site-a", time.Second); after.Term != st.Term {
		t.Errorf("term moved from %d to %d", st.Term, after.Term)
	}

	code, stdout, stderr = runBinary(t, 20*time.Second, "resume", "--nats-url", url, "--pair", pair)
	if code != exitOK || !strings.Contains(stdout, "resumed") || !strings.Contains(stdout, "seen by site-a and site-b") {
		t.Fatalf("resume: exit %d\nstdout: %s\nstderr: %s", code, stdout, stderr)
	}
	if p := statusOf(t, url, pair)[0].Pause; p == nil || p.Paused {
		t.Errorf("status after resume: %+v", p)
	}
}
