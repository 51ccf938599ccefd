package main

import (
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
)

// The state machines of actors/ are pure: no goroutine, no process, file
// or network I/O — inputs in, events out (DESIGN.md, "one behaviour, two
// hosts"). The drivers beside them (procedure's exec driver, the resource
// reconcilers) do I/O by contract and are called by the runtime; they are
// not listed here.
var stateMachines = map[string]func(file string) bool{
	"understudy/actors/failover":  func(string) bool { return true },
	"understudy/actors/agent":     func(string) bool { return true },
	"understudy/actors/procedure": func(f string) bool { return f == "runner.go" || f == "spec.go" || f == "events.go" },
}

var impureImports = []string{"os", "os/exec", "net", "net/http", "syscall", "io/fs"}

func TestStateMachinesArePure(t *testing.T) {
	checked := map[string]int{}
	for _, p := range listPackages(t) {
		in, ok := stateMachines[p.ImportPath]
		if !ok {
			continue
		}
		for _, name := range p.GoFiles {
			if !in(name) {
				continue
			}
			path := filepath.Join(p.Dir, name)
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				t.Fatalf("parse %s: %v", path, err)
			}
			checked[p.ImportPath]++
			for _, imp := range f.Imports {
				ip := strings.Trim(imp.Path.Value, `"`)
				for _, bad := range impureImports {
					if ip == bad {
						t.Errorf("%s imports %s: a state machine takes the results of I/O as inputs", path, ip)
					}
				}
			}
			ast.Inspect(f, func(n ast.Node) bool {
				if _, ok := n.(*ast.GoStmt); ok {
					t.Errorf("%s starts a goroutine: the hosts (runtime, simulations) own concurrency", path)
				}
				return true
			})
		}
	}
	for pkg := range stateMachines {
		if checked[pkg] == 0 {
			t.Errorf("no file of %s checked: the check would prove nothing", pkg)
		}
	}
}
