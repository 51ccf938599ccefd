package main

import (
	"context"
	"errors"
	"testing"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// A secured pair has no <pair>.config until an operator writes one: the
// CLI reads the rules its members published under <pair>.rules.<site>,
// and <pair>.config wins once it exists.
func TestReadRulesFallsBackToPublishedRules(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	kv := events.NewMemoryKV("understudy_failover", events.SystemClock{})
	rules := failover.DefaultRules("pg", "site-a", "site-b")
	if _, _, err := readRules(ctx, kv, "pg"); err == nil {
		t.Fatal("rules read from an empty bucket")
	}
	if _, err := kv.Put(ctx, failover.RulesKey("pg", "site-b"), failover.EncodeRules(rules)); err != nil {
		t.Fatal(err)
	}
	if _, err := kv.Put(ctx, failover.RulesKey("pg", "site-a"), []byte("garbage")); err != nil {
		t.Fatal(err)
	}
	got, e, err := readRules(ctx, kv, "pg")
	if err != nil || got != rules || e.Key != failover.RulesKey("pg", "site-b") {
		t.Fatalf("readRules = %v, %s, %v; want the rules site-b published", got, e.Key, err)
	}
	tuned := rules
	tuned.FailoverTimeout = 9 * time.Second
	if _, err := kv.Put(ctx, failover.ConfigKey("pg"), failover.EncodeRules(tuned)); err != nil {
		t.Fatal(err)
	}
	if got, e, err := readRules(ctx, kv, "pg"); err != nil || got != tuned || e.Key != failover.ConfigKey("pg") {
		t.Fatalf("readRules = %v, %s, %v; want <pair>.config's", got, e.Key, err)
	}
}

// A direct read that goes unanswered (a stream whose leadership moves) is
// tried again after getAttempt, not given up; other errors are not retried.
func TestRetryGetRetriesTimeoutsOnly(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := 0
	err := retryGet(ctx, func(ctx context.Context) error {
		calls++
		if calls < 3 {
			<-ctx.Done() // unanswered until the attempt's deadline
			return ctx.Err()
		}
		return nil
	})
	if err != nil || calls != 3 {
		t.Fatalf("retryGet = %v after %d calls; want success at the third", err, calls)
	}
	calls = 0
	err = retryGet(ctx, func(context.Context) error { calls++; return events.ErrNotFound })
	if !errors.Is(err, events.ErrNotFound) || calls != 1 {
		t.Fatalf("retryGet = %v after %d calls; want ErrNotFound at once", err, calls)
	}
}
