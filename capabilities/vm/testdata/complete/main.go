// Command complete is the control of testdata/lacking: the same program
// with vm.VM as the workload compiles, so lacking fails for the method it
// lacks and for nothing else.
package main

import (
	"understudy/actors/capability"
	"understudy/capabilities/vm"
)

// As an interface value.
var _ capability.Workload = (*vm.VM)(nil)

// As a pair's host takes its workload: a type parameter.
func host[W capability.Workload](w W) W { return w }

func main() { _ = host((*vm.VM)(nil)) }
