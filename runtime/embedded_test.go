package runtime

import (
	"context"
	"log/slog"
	"net"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"
)

func TestEmbeddedJetStreamSyncAlwaysPersists(t *testing.T) {
	log, rec := newLogRecorder(t)
	dir := t.TempDir()
	start := func() *EmbeddedNATS {
		e, err := StartEmbedded(EmbeddedConfig{DataDir: dir, Host: "127.0.0.1", Port: -1}, log)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(e.Shutdown)
		return e
	}
	e := start()
	srv := e.Server()
	if !srv.JetStreamEnabled() {
		t.Fatal("JetStream not enabled")
	}
	jsc := srv.JetStreamConfig()
	if !jsc.SyncAlways {
		t.Error("JetStream SyncAlways is off: acknowledged writes could be lost on power loss")
	}
	if jsc.StoreDir != dir && !strings.HasPrefix(jsc.StoreDir, dir+string(filepath.Separator)) {
		t.Errorf("store dir %q is not in the data dir %q", jsc.StoreDir, dir)
	}
	if !strings.HasPrefix(e.ClientURL(), "nats://127.0.0.1:") || strings.HasSuffix(e.ClientURL(), ":-1") {
		t.Errorf("client URL %q: want nats://127.0.0.1:<real port>", e.ClientURL())
	}

	// Write one message, restart on the same directory, read it back.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	nc, err := nats.Connect(e.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	js, _ := jetstream.New(nc)
	if _, err := js.CreateStream(ctx, jetstream.StreamConfig{Name: "T", Subjects: []string{"t.>"}}); err != nil {
		t.Fatal(err)
	}
	if _, err := js.Publish(ctx, "t.a", []byte("kept")); err != nil {
		t.Fatal(err)
	}
	nc.Close()
	e.Shutdown()
	if srv.Running() {
		t.Fatal("server still running after Shutdown")
	}
	if _, err := net.DialTimeout("tcp", strings.TrimPrefix(e.ClientURL(), "nats://"), time.Second); err == nil {
		t.Fatal("client port still accepts connections after Shutdown")
	}

	e2 := start()
	nc2, err := nats.Connect(e2.ClientURL())
	if err != nil {
		t.Fatal(err)
	}
	defer nc2.Close()
	js2, _ := jetstream.New(nc2)
	s, err := js2.Stream(ctx, "T")
	if err != nil {
		t.Fatal(err)
	}
	msg, err := s.GetLastMsgForSubject(ctx, "t.a")
	if err != nil {
		t.Fatal(err)
	}
	if string(msg.Data) != "kept" {
		t.Fatalf("after restart: %q, want %q", msg.Data, "kept")
	}

	// nats-server's own lines reach slog, its notices at debug only.
	var fromServer int
	for _, l := range rec.all() {
		if l.Attrs["component"].String() != "nats-server" || l.Msg == "embedded nats started" || l.Msg == "embedded nats stopped" {
			continue
		}
		fromServer++
		if l.Level > slog.LevelDebug && l.Level < slog.LevelWarn {
			t.Errorf("nats-server notice logged at %s, want debug: %q", l.Level, l.Msg)
		}
	}
	if fromServer == 0 {
		t.Error("no nats-server log line reached slog")
	}
	started := rec.matching("embedded nats started")
	if len(started) != 2 || !started[0].Attrs["sync_always"].Bool() {
		t.Errorf("want two 'embedded nats started' lines with sync_always=true, got %v", started)
	}
}

func TestEmbeddedPortInUseFailsFast(t *testing.T) {
	log, _ := newLogRecorder(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	port := ln.Addr().(*net.TCPAddr).Port

	begin := time.Now()
	e, err := StartEmbedded(EmbeddedConfig{DataDir: t.TempDir(), Host: "127.0.0.1", Port: port, ReadyTimeout: 20 * time.Second}, log)
	if err == nil {
		e.Shutdown()
		t.Fatal("started on a port in use")
	}
	if took := time.Since(begin); took > 5*time.Second {
		t.Errorf("took %s to report the port in use; want the fatal error at once", took)
	}
	t.Log(err)
	if !strings.Contains(err.Error(), strconv.Itoa(port)) {
		t.Errorf("error %q does not name the port", err)
	}
}
