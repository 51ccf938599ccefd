// Command lacking must not compile: its workload has every method of
// capability.Workload but Rejoin. vm's TestWorkloadLackingRejoinDoesNotCompile
// builds it and expects "missing method Rejoin" — the proof that a pair is
// composed over the capability, checked by the compiler, not hand-wired.
package main

import (
	"context"

	"understudy/actors/capability"
)

// lacking fences, promotes, demotes and checks, but cannot rejoin.
type lacking struct{}

func (lacking) Fence(context.Context, capability.Request) error   { return nil }
func (lacking) Promote(context.Context, capability.Request) error { return nil }
func (lacking) Demote(context.Context, capability.Request) error  { return nil }
func (lacking) Check(context.Context, capability.Request) (capability.Status, error) {
	return capability.Status{}, nil
}

// As an interface value.
var _ capability.Workload = lacking{}

// As a pair's host takes its workload: a type parameter.
func host[W capability.Workload](w W) W { return w }

func main() { _ = host(lacking{}) }
