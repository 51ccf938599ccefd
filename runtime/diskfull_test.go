package runtime

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"understudy/events"
)

// smallDisk mounts a tmpfs of size bytes for the test (root only; it says
// so loudly when it cannot).
func smallDisk(t *testing.T, size string) string {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Skip("DISK-FULL FAULT NOT RUN: mounting a small tmpfs needs root")
	}
	dir := t.TempDir()
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size="+size, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("DISK-FULL FAULT NOT RUN: mount tmpfs: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = syscall.Unmount(dir, syscall.MNT_DETACH) })
	return dir
}

// fill writes a file until the disk is full and returns its path.
func fill(t *testing.T, dir string) string {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	buf := make([]byte, 1<<20)
	for {
		if _, err := f.Write(buf); err != nil {
			if errors.Is(err, syscall.ENOSPC) {
				break
			}
			t.Fatal(err)
		}
	}
	// The last partial megabyte too.
	for {
		if _, err := f.Write(buf[:4096]); err != nil {
			break
		}
	}
	return path
}

// After the data directory's disk was full and then freed, the embedded
// JetStream takes writes again by itself (and says so), without a
// restart of the node.
func TestEmbeddedJetStreamRecoversAfterDiskFull(t *testing.T) {
	dir := smallDisk(t, "48m")
	log, rec := newLogRecorder(t)
	es, err := StartEmbedded(EmbeddedConfig{DataDir: filepath.Join(dir, "nats"), Host: "127.0.0.1", Port: -1}, log)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(es.Shutdown)
	nc := connectTo(t, es.ClientURL())
	js, err := jetstream.New(nc)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	names := DefaultConfig().Assets
	if _, err := Provision(ctx, js, DefaultAssets(names, 1), log); err != nil {
		t.Fatal(err)
	}
	kv, err := events.NewJetStreamKV(ctx, js, names.FailoverBucket)
	if err != nil {
		t.Fatal(err)
	}
	put := func() error {
		pctx, pcancel := context.WithTimeout(ctx, time.Second)
		defer pcancel()
		_, err := kv.Put(pctx, "pg.hb.site-a", make([]byte, 512))
		return err
	}
	if err := put(); err != nil {
		t.Fatal(err)
	}
	filler := fill(t, dir)
	var full error
	for i := 0; i < 200 && full == nil; i++ {
		full = put()
	}
	if full == nil {
		t.Fatal("writes still succeed on a full disk")
	}
	t.Logf("on a full disk: %v", full)
	if !es.StoreFull() {
		t.Error("the store is not reported full (/healthz would say ok)")
	}
	if n := len(rec.matching("jetstream store is out of space: writes are refused until space is freed (recovery is automatic)")); n != 1 {
		t.Errorf("out of space reported %d times, want once", n)
	}
	if err := os.Remove(filler); err != nil {
		t.Fatal(err)
	}
	freed := time.Now()
	var last error
	for deadline := time.Now().Add(20 * time.Second); ; time.Sleep(100 * time.Millisecond) {
		if last = put(); last == nil {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("JetStream still refuses writes %v after space was freed: %v", time.Since(freed), last)
		}
	}
	t.Logf("writes accepted again %v after space was freed", time.Since(freed))
	if es.StoreFull() {
		t.Error("the store is still reported full after it recovered")
	}
	if n := len(rec.matching("jetstream recovered after the data directory ran out of space")); n != 1 {
		t.Errorf("recovery logged %d times, want once", n)
	}
	// What was stored before the disk filled is still there.
	e, err := kv.Get(ctx, "pg.hb.site-a")
	if err != nil || len(e.Value) != 512 {
		t.Errorf("after recovery: %+v %v", e, err)
	}
}
