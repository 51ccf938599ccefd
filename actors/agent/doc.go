// Package agent is the node agent's pure logic: the typed desired state
// (AgentManifest) an operator applies, the status (AgentStatus) an agent
// reports, the diff between a manifest and what the agent runs, the retry
// backoff, and the events every resource transition records.
//
// It does no I/O and reads no clock: the runtime's agent actor
// (runtime/agent.go) watches the manifest in KV, runs one hollywood actor
// per resource that calls the kind's reconciler (actors/resources), and
// writes the status back by compare-and-set.
package agent
