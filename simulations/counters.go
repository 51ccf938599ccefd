package simulations

// counterID is an Antithesis-style "sometimes" counter: something a
// scenario claims to exercise. A scenario whose required counters stay 0
// did not test what it says it tests, and the result says so.
type counterID int

const (
	cFailover              counterID = iota // a takeover: an acquire won the register from another site's holder
	cFailback                               // the preferred primary took the register back by handoff
	cSwitchover                             // a planned handoff (operator switchover) completed
	cStoppedBeforeTakeover                  // the old holder's database had stopped when the takeover won
	cFencedTakeover                         // the takeover replaced a holder that stayed fenced
	cPromotionRejected                      // an acquire CAS lost: the register had moved
	cAcquireFailed                          // an acquire failed or got no answer in time
	cLateAck                                // a write's answer arrived after its deadline
	cOwnLateWrite                           // a holder's CAS met its own late write and adopted it
	cRiddenOut                              // a heartbeat failure recovered without fencing
	cSelfFenced                             // a holder fenced itself after failure_threshold failures
	cFenceSlow                              // a fence chain took longer than heartbeat_timeout
	cFenceEscalated                         // a fence step failed or timed out and the next one ran
	cStepHung                               // a step hung until its timeout
	cFenceRetried                           // a whole fence chain failed and was retried
	cPromoteFailed                          // a promote chain failed (the member hands over)
	cDemoteFailed                           // a demote chain failed (the member fences instead)
	cLeadershipLost                         // a holder saw another writer take the register
	cReplicaCutOff                          // a follower was cut off past failover_timeout and did not promote
	cJumpFalseFailure                       // a clock jump made a holder count a failure
	cJumpNoPromotion                        // a follower's clock jumped past failover_timeout; it did not promote
	cServerClockBump                        // the NATS server's clock was bumped
	cRestartFenced                          // a restarted member came up fenced
	cResumed                                // a member found the register naming it (restart, lost answer) and resumed it fenced
	cZombieWrite                            // a write from a dead process landed
	cNatsOutage                             // the NATS server went down
	cLostAckedWrites                        // a NATS power cut lost acknowledged writes (fsync: interval)
	cDeadReplaced                           // a dead holder was replaced by the survivor
	cWatchdogKill                           // a paused member outlasted its watchdog and was killed
	cAppendRetried                          // an event append got no answer and was retried
	cAppendConflict                         // an appender concluded that another process appends to its subject (its member stopped)
	cDuplicateAck                           // an event append retry was acked as a duplicate of its own first attempt
	cBufferedFlushed                        // a NATS client flushed what it buffered while disconnected
	cLeaderElected                          // a stream leader without quorum was replaced by an election
	cInFlightRefused                        // a leader without quorum refused a write with 10164 (a proposal in flight)
	cProposalLate                           // a leader regained its quorum and committed a proposal late
	cStaleRead                              // the register read after a conflict was older than the server's
	cWatchLagged                            // a watch delivery came late from a lagging server
	// Database mode (database.go).
	cDBBootstrapped     // a database was created from nothing (bootstrap)
	cDBCloned           // a rejoin cloned an empty database from the leader
	cDBRewound          // a rejoin rewound a diverged database onto the leader's history
	cDBRejoinFailed     // a rejoin failed (leader unreachable, link cut, fault)
	cDBPromoteEmpty     // a promote step refused an empty database (no bootstrap)
	cDBWithheld         // a follower withheld its promotion (lag limit, synchronous)
	cDBCommitWaited     // a commit waited for the standby (synchronous)
	cDBSyncOn           // a leader's register said its commits wait for the standby
	cDBSyncOff          // ... and later that they stopped waiting
	cDBLossWithinLimit  // an asynchronous promotion lost acknowledged commits within what the rules allow
	cDBStandbyFenced    // a fence found a standby and left it streaming
	cDBFailbackStreamed // a failback went to a streaming standby of the leader
	// Forgers (forge.go).
	cForgedWritten // a forger wrote a value no member wrote
	cForgedIgnored // a member recorded a register value it does not take for a member's write
	cLostToForger  // a holder took a value the forger wrote for another's write and lost the register
	cAppendIDTaken // a duplicate ack named a record not the appender's (a message on another subject under its id): appended again
	// Node leadership (liveness.go).
	cEpochRaised // a member raised a stale node's epoch
	cLiveMissed  // a member fell behind its node's liveness log (items it never took in)
	// Store throughput and node write bound (throughput.go).
	cSurvivorHeartbeatFailed // a member counted a failed liveness write of its node while the peer node was down and its link clear
	cNotIssued               // a member request waited at its node's bound past its turn (a KV write: half its window; an append: its deadline) and was never issued
	cRegisterLandedLate      // node mode: a holder's register write landed after its deadline (the holder counted it failed and writes again)
	// Append conflicts (appender.go).
	cRetryUnrecognised // the retry of an append that landed past the dedup window met 10071: the client's read of its first attempt failed
	cConflictUnread    // an append conflict's records could not be read: undecided, retried
	cConflictOwnLanded // an append conflict's first record after last was the appender's own: its attempt had landed
	cConflictForeign   // an append conflict's records after last were all foreign: skipped
	// Batches of member KV writes (batch.go).
	cBatchSent  // a node sent waiting member writes as one atomic batch
	cBatchSplit // a batch was refused on a conflict (split in two, or sent again without the writes the watch showed stale)
	cStale      // a compare-and-set on a register revision the node's watch had delivered replaced was answered as a conflict without the store (rule 1)
	cUncertain  // a compare-and-set on a key whose latest write may have landed unanswered went alone, not in a batch (rule 3)
	cBatchLate  // a batch part was not answered by its earliest write's deadline: failed without a definite answer, its keys uncertain
	// Raises of a node's epoch made once (raise.go).
	cRaiseJoined // a member's raise joined an identical raise of its node's, in flight or just answered
	// Batches of appends (appendbatch.go).
	cAppendBatchSent  // a node sent waiting appends as one atomic batch (two or more)
	cAppendBatched    // appends sent in those batches
	cAppendBatchSplit // a batch of appends was refused (an expectation stale, a message id held) and halved
	cAppendBatchLate  // a batch of appends was not answered by its earliest append's deadline: every append of it failed
	cAppendUncertain  // an append was queued while its subject's latest append may have landed unanswered: it goes alone
	// The store's disk and the node's connection (conn.go).
	cDiskHeld          // a write reached the server while its disk stalled: it waited for the stall's end
	cConnGivenUp       // a node gave its connection up (heard nothing for heartbeat_timeout) and reconnected
	cConnKeptBusy      // a node kept a silent connection because its server answered a side connection (a busy store)
	cConnRefusedAtOnce // a request was refused at once by the node's client while it reconnected (nothing sent)
	cBatchNotCommitted // a batch could not be sent (its connection reconnecting): not committed, nothing written
	cBatchesOff        // HostConnNaive: a batch not committed was taken for a refusal; the node's batches off for a minute
	numCounters
)

var counterNames = [numCounters]string{
	cFailover:                "failover",
	cFailback:                "failback",
	cSwitchover:              "switchover",
	cStoppedBeforeTakeover:   "old-holder-stopped-before-takeover",
	cFencedTakeover:          "fenced-holder-taken-over",
	cPromotionRejected:       "promotion-rejected-by-cas",
	cAcquireFailed:           "acquire-failed",
	cLateAck:                 "late-ack",
	cOwnLateWrite:            "own-late-write-adopted",
	cRiddenOut:               "heartbeat-failure-ridden-out",
	cSelfFenced:              "self-fenced-on-heartbeat-failures",
	cFenceSlow:               "fencing-slower-than-heartbeat-timeout",
	cFenceEscalated:          "fence-step-escalated",
	cStepHung:                "step-hung-until-timeout",
	cFenceRetried:            "fence-chain-failed-and-retried",
	cPromoteFailed:           "promote-failed",
	cDemoteFailed:            "demote-failed",
	cLeadershipLost:          "leadership-lost",
	cReplicaCutOff:           "follower-cut-off-past-failover-timeout",
	cJumpFalseFailure:        "clock-jump-false-failure",
	cJumpNoPromotion:         "follower-clock-jump-without-promotion",
	cServerClockBump:         "server-clock-bumped",
	cRestartFenced:           "restart-came-up-fenced",
	cResumed:                 "register-resumed",
	cZombieWrite:             "zombie-write-landed",
	cNatsOutage:              "nats-outage",
	cLostAckedWrites:         "nats-lost-acked-writes",
	cDeadReplaced:            "dead-holder-replaced",
	cWatchdogKill:            "watchdog-killed-paused-member",
	cAppendRetried:           "event-append-retried",
	cAppendConflict:          "event-append-conflict",
	cDuplicateAck:            "event-append-duplicate-ack",
	cBufferedFlushed:         "reconnect-buffer-flushed",
	cLeaderElected:           "stream-leader-elected",
	cInFlightRefused:         "write-refused-in-flight-10164",
	cProposalLate:            "proposal-committed-at-heal",
	cStaleRead:               "stale-register-read",
	cWatchLagged:             "watch-lagged",
	cDBBootstrapped:          "db-bootstrapped",
	cDBCloned:                "db-cloned",
	cDBRewound:               "db-rewound",
	cDBRejoinFailed:          "db-rejoin-failed",
	cDBPromoteEmpty:          "db-promote-refused-empty",
	cDBWithheld:              "db-promotion-withheld",
	cDBCommitWaited:          "db-commit-waited-for-standby",
	cDBSyncOn:                "db-synchronous-on",
	cDBSyncOff:               "db-synchronous-off",
	cDBLossWithinLimit:       "db-async-loss-within-limit",
	cDBStandbyFenced:         "db-standby-fenced-kept-streaming",
	cDBFailbackStreamed:      "db-failback-to-streaming-standby",
	cForgedWritten:           "forged-value-written",
	cForgedIgnored:           "forged-value-ignored",
	cLostToForger:            "leadership-lost-to-forged-value",
	cAppendIDTaken:           "event-append-id-taken",
	cEpochRaised:             "node-epoch-raised",
	cLiveMissed:              "member-behind-liveness-log",
	cSurvivorHeartbeatFailed: "survivor-heartbeat-failed-during-takeover",
	cNotIssued:               "member-request-not-issued-by-deadline",
	cRegisterLandedLate:      "register-write-landed-after-deadline",
	cRetryUnrecognised:       "event-append-retry-unrecognised",
	cConflictUnread:          "event-append-conflict-unread-retried",
	cConflictOwnLanded:       "event-append-conflict-own-record-landed",
	cConflictForeign:         "event-append-conflict-foreign-skipped",
	cBatchSent:               "host-batch-sent",
	cBatchSplit:              "host-batch-split-on-conflict",
	cStale:                   "host-write-stale-answered",
	cUncertain:               "host-write-uncertain-alone",
	cBatchLate:               "host-batch-unanswered-by-deadline",
	cRaiseJoined:             "epoch-raise-joined",
	cAppendBatchSent:         "host-batch-appends-sent",
	cAppendBatched:           "host-batch-appends",
	cAppendBatchSplit:        "host-batch-appends-split-on-conflict",
	cAppendBatchLate:         "host-batch-appends-unanswered-by-deadline",
	cAppendUncertain:         "host-append-uncertain-alone",
	cDiskHeld:                "store-write-held-by-disk-stall",
	cConnGivenUp:             "conn-given-up",
	cConnKeptBusy:            "conn-kept-busy",
	cConnRefusedAtOnce:       "conn-request-refused-reconnecting",
	cBatchNotCommitted:       "host-batch-not-committed",
	cBatchesOff:              "host-batches-off-for-a-minute",
}

func (c counterID) String() string { return counterNames[c] }
