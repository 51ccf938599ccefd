package runtime

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"understudy/actors/failover"
	"understudy/events"
)

// The deployment's leadership. Both members of a pair must keep
// leadership the same way: a per-pair holder writes its register every
// heartbeat and reads a register that names a node and an epoch as
// another per-pair lease, while a node-mode follower judges a holder by
// its node's liveness record, which a per-pair node never writes. Two
// nodes of one deployment that disagree are a configuration no test or
// seed covers. The first node that starts with members records its
// leadership in the failover bucket (failover.DeploymentLeadershipKey);
// every node after it starts only if its node file says the same.

// DeploymentLeadership is the deployment's leadership record.
type DeploymentLeadership struct {
	Leadership string    `json:"leadership"` // "node" or "per-pair"
	By         string    `json:"by"`         // the node that recorded it
	At         time.Time `json:"at"`         // when, by that node's clock
}

// maxDeploymentRecord bounds the record's size: it is read from NATS.
const maxDeploymentRecord = 1024

// DecodeDeploymentLeadership reads a leadership record, refusing one
// larger than maxDeploymentRecord or naming no known leadership.
func DecodeDeploymentLeadership(b []byte) (DeploymentLeadership, Leadership, error) {
	var d DeploymentLeadership
	if len(b) > maxDeploymentRecord {
		return d, 0, fmt.Errorf("runtime: the deployment's leadership record is %d bytes, more than %d", len(b), maxDeploymentRecord)
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, 0, fmt.Errorf("runtime: the deployment's leadership record does not decode: %w", err)
	}
	l, err := failover.ParseLeadership(d.Leadership)
	if err != nil {
		return d, 0, fmt.Errorf("runtime: the deployment's leadership record: leadership: %w", err)
	}
	return d, l, nil
}

// LeadershipMismatchError: a node file's leadership is not the
// deployment's.
type LeadershipMismatchError struct {
	File       Leadership           // the node file's
	Deployment DeploymentLeadership // the record
	Key        string               // where the record is
}

func (e *LeadershipMismatchError) Error() string {
	return fmt.Sprintf("runtime: leadership: the node file says %s, but this deployment runs %s (recorded in %s by node %q at %s); "+
		"every node of a deployment must run the same leadership: set leadership: %s in the node file, or change the deployment's "+
		"with `understudy leadership set %s` once every node is stopped",
		e.File, e.Deployment.Leadership, e.Key, e.Deployment.By, e.Deployment.At.UTC().Format(time.RFC3339), e.Deployment.Leadership, e.File)
}

// leadershipRefusal is a record that does not decode: the start is
// refused, as for a *LeadershipMismatchError.
type leadershipRefusal struct{ error }

func (r leadershipRefusal) Unwrap() error { return r.error }

// refusesStart reports whether err of checkDeploymentLeadership refuses
// the start; any other error is the store's, worth another try.
func refusesStart(err error) bool {
	var mm *LeadershipMismatchError
	var rf leadershipRefusal
	return errors.As(err, &mm) || errors.As(err, &rf)
}

// checkDeploymentLeadership compares the node file's leadership with the
// deployment's record, recording it when there is none yet and record is
// set (a node that starts with members; an agent's node without any
// only compares). A record that disagrees, or that cannot be read,
// refuses the start (refusesStart).
func checkDeploymentLeadership(ctx context.Context, kv events.KV, node string, l Leadership, record bool, log *slog.Logger) error {
	key := failover.DeploymentLeadershipKey
	for range 3 {
		e, err := kv.Get(ctx, key)
		switch {
		case errors.Is(err, events.ErrNotFound) && !record:
			return nil
		case errors.Is(err, events.ErrNotFound):
			v, _ := json.Marshal(DeploymentLeadership{Leadership: l.String(), By: node, At: time.Now().UTC()})
			if _, err := kv.Create(ctx, key, v); errors.Is(err, events.ErrConflict) {
				continue // another node recorded it first: compare with it
			} else if err != nil {
				return fmt.Errorf("runtime: recording the deployment's leadership (%s): %w", key, err)
			}
			log.Info("deployment leadership recorded", "leadership", l.String(), "key", key)
			return nil
		case err != nil:
			return fmt.Errorf("runtime: reading the deployment's leadership (%s): %w", key, err)
		}
		d, dl, err := DecodeDeploymentLeadership(e.Value)
		if err != nil {
			return leadershipRefusal{fmt.Errorf("%w (key %s, revision %d); record it again with `understudy leadership set node|per-pair` once every node is stopped", err, key, e.Revision)}
		}
		if dl != l {
			return &LeadershipMismatchError{File: l, Deployment: d, Key: key}
		}
		log.Debug("deployment leadership matches", "leadership", l.String(), "recorded_by", d.By)
		return nil
	}
	return fmt.Errorf("runtime: recording the deployment's leadership (%s): created and gone again three times", key)
}

// checkLeadershipRetrying is checkDeploymentLeadership on the bucket open
// gives, tried again while the store fails (not when the record refuses)
// until ctx ends.
func checkLeadershipRetrying(ctx context.Context, open func() (events.KV, error), node string, l Leadership, record bool, log *slog.Logger) error {
	for wait := 100 * time.Millisecond; ; wait = min(2*wait, 2*time.Second) {
		kv, err := open()
		if err == nil {
			err = checkDeploymentLeadership(ctx, kv, node, l, record, log)
		}
		if err == nil || refusesStart(err) {
			return err
		}
		log.Warn("the deployment's leadership could not be read, retrying", "error", err, "next_delay", wait)
		select {
		case <-ctx.Done():
			return fmt.Errorf("runtime: the deployment's leadership (gave up): %w", err)
		case <-time.After(wait):
		}
	}
}
