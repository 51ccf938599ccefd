package simulations

import (
	"io"
	"strconv"

	"understudy/events"
)

// export writes the run's history in the export format: the KV records of
// the failover bucket (member heartbeats and register writes; what a NATS
// power cut lost is not there, as on a real server), then the records of
// the event stream (ev.failover.<pair>.<site>, ev.procedure.<pair>.<site>).
func (s *sim) export(w io.Writer, r *Result) error {
	src := s.cfg.Source
	if src == "" {
		src = Command(s.cfg, "")
	}
	rl := s.rules
	h := events.ExportHeader{
		Created: s.server.opts.Start, // deterministic: the run's own epoch
		Source:  src,
		Pair:    rl.Pair,
		From:    s.server.opts.Start,
		To:      s.server.opts.Start.Add(s.now),
		Meta: map[string]string{
			"simulator":         "understudy simulate",
			"scenario":          s.sc.Name,
			"seed":              strconv.FormatUint(s.cfg.Seed, 10),
			"duration":          FormatDuration(s.end),
			"digest":            r.Digest,
			"faults":            r.Faults,
			"fsync":             s.cfg.Fsync.String(),
			"primary":           rl.Primary,
			"replica":           rl.Replica,
			"heartbeat_timeout": rl.HeartbeatTimeout.String(),
			"failure_threshold": strconv.Itoa(rl.FailureThreshold),
			"success_threshold": strconv.Itoa(rl.SuccessThreshold),
			"failover_timeout":  rl.FailoverTimeout.String(),
			"fence_grace":       rl.FenceGrace.String(),
			"failback":          rl.Failback.String(),
			"violations":        strconv.Itoa(len(r.Violations)),
		},
	}
	ew, err := events.NewExportWriter(w, h)
	if err != nil {
		return err
	}
	for _, e := range s.server.journal {
		if err := ew.Write(events.KVRecord(s.server.opts.Bucket, e)); err != nil {
			return err
		}
	}
	for rec, err := range s.server.log.Read(bg, events.ReadOptions{}) {
		if err != nil {
			return err
		}
		if err := ew.Write(rec); err != nil {
			return err
		}
	}
	return ew.Close()
}
