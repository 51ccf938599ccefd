package main

import (
	"bytes"
	"encoding/json"
	"go/ast"
	"go/parser"
	"go/token"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// The layering of DESIGN.md, enforced: each top-level folder lists which of
// our folders its non-test code may import directly.
var allowedInternal = map[string][]string{
	"events":      {"events"},
	"actors":      {"events", "actors"},
	"projections": {"events", "actors", "projections"},
	"simulations": {"events", "actors", "projections", "simulations"},
	// Workloads a pair protects (capability.Workload implementations that
	// do I/O and keep time: PostgreSQL, a libvirt VM): beside actors/, used
	// by the runtime.
	"capabilities": {"events", "actors", "capabilities"},
	"runtime":      {"events", "actors", "capabilities", "runtime"},
	"cmd":          {"events", "actors", "capabilities", "projections", "runtime", "simulations", "cmd"},
	// The real partition suite drives the built binaries and nats-server
	// processes: it imports nothing of the module (docs/partitions.md).
	"partition": {"partition"},
	// The real PostgreSQL pair suite, likewise (pgsuite/doc.go).
	"pgsuite": {"pgsuite"},
}

// Third-party imports forbidden per folder (prefix match).
var forbiddenExternal = map[string][]string{
	"events":       {"github.com/anthdm/hollywood", "github.com/nats-io/nats-server"},
	"actors":       {"github.com/nats-io/", "github.com/anthdm/hollywood"},
	"projections":  {"github.com/anthdm/hollywood", "github.com/nats-io/nats-server"},
	"simulations":  {"github.com/anthdm/hollywood", "github.com/nats-io/"},
	"capabilities": {"github.com/anthdm/hollywood", "github.com/nats-io/"},
}

type listedPackage struct {
	ImportPath string
	Dir        string
	Imports    []string
	GoFiles    []string
}

func listPackages(t *testing.T) []listedPackage {
	t.Helper()
	cmd := exec.Command("go", "list", "-tags", "libvirt_dlopen", "-json", "understudy/...")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list: %v\n%s", err, stderr.String())
	}
	var pkgs []listedPackage
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var p listedPackage
		if err := dec.Decode(&p); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) < 6 {
		t.Fatalf("go list found only %d packages; the check would prove nothing", len(pkgs))
	}
	return pkgs
}

func topFolder(importPath string) string {
	rest := strings.TrimPrefix(importPath, "understudy/")
	top, _, _ := strings.Cut(rest, "/")
	return top
}

func TestImportDirection(t *testing.T) {
	for _, p := range listPackages(t) {
		top := topFolder(p.ImportPath)
		allowed, ok := allowedInternal[top]
		if !ok {
			t.Errorf("package %s lives in folder %q, which DESIGN.md's layout does not have", p.ImportPath, top)
			continue
		}
		for _, imp := range p.Imports {
			if strings.HasPrefix(imp, "understudy/") {
				if !contains(allowed, topFolder(imp)) {
					t.Errorf("%s imports %s: %s/ may only import %v of ours", p.ImportPath, imp, top, allowed)
				}
				continue
			}
			for _, bad := range forbiddenExternal[top] {
				if strings.HasPrefix(imp, bad) {
					t.Errorf("%s imports %s: forbidden in %s/ (layout of DESIGN.md)", p.ImportPath, imp, top)
				}
			}
		}
	}
}

// actors/ is pure: time enters only through inputs.
func TestActorsReadNoClock(t *testing.T) {
	checked := 0
	for _, p := range listPackages(t) {
		if topFolder(p.ImportPath) != "actors" {
			continue
		}
		for _, name := range p.GoFiles {
			path := filepath.Join(p.Dir, name)
			f, err := parser.ParseFile(token.NewFileSet(), path, nil, 0)
			if err != nil {
				t.Fatalf("parse %s: %v", path, err)
			}
			checked++
			timeName := importName(f, "time")
			if timeName == "" {
				continue
			}
			ast.Inspect(f, func(n ast.Node) bool {
				sel, ok := n.(*ast.SelectorExpr)
				if !ok {
					return true
				}
				if id, ok := sel.X.(*ast.Ident); ok && id.Name == timeName {
					switch sel.Sel.Name {
					case "Now", "Since", "Until", "Sleep", "After", "Tick", "NewTimer", "NewTicker", "AfterFunc":
						t.Errorf("%s uses time.%s: actors/ takes time from its inputs only", path, sel.Sel.Name)
					}
				}
				return true
			})
		}
	}
	if checked == 0 {
		t.Fatal("no Go file found under actors/: the check would prove nothing")
	}
}

func importName(f *ast.File, path string) string {
	for _, imp := range f.Imports {
		if strings.Trim(imp.Path.Value, `"`) != path {
			continue
		}
		if imp.Name != nil {
			return imp.Name.Name
		}
		return filepath.Base(path)
	}
	return ""
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// listDeps lists the packages a main package links (go list -deps).
func listDeps(t *testing.T, pkg string) []listedDep {
	t.Helper()
	cmd := exec.Command("go", "list", "-deps", "-tags", "libvirt_dlopen", "-json=ImportPath,Standard,Imports,CgoFiles", pkg)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("go list -deps %s: %v\n%s", pkg, err, stderr.String())
	}
	var deps []listedDep
	dec := json.NewDecoder(bytes.NewReader(out))
	for dec.More() {
		var d listedDep
		if err := dec.Decode(&d); err != nil {
			t.Fatalf("decode go list output: %v", err)
		}
		deps = append(deps, d)
	}
	return deps
}

type listedDep struct {
	ImportPath string
	Standard   bool
	Imports    []string
	CgoFiles   []string
}

const libvirtModule = "libvirt.org/go/libvirt"

// The understudy binary links no libvirt: the module loads libvirt.so.0
// and some forty libraries at the start of every process that links it
// (the node agent's idle memory doubled). libvirt calls run in the
// understudy-libvirt process (libvirt.DriverProcess). Without any cgo
// package of its own, understudy also builds with CGO_ENABLED=0.
func TestUnderstudyLinksNoLibvirt(t *testing.T) {
	linksLibvirt := func(deps []listedDep) (importers []string) {
		for _, d := range deps {
			if contains(d.Imports, libvirtModule) {
				importers = append(importers, d.ImportPath)
			}
		}
		return importers
	}
	deps := listDeps(t, "understudy/cmd/understudy")
	if len(deps) < 50 {
		t.Fatalf("go list found only %d dependencies; the check would prove nothing", len(deps))
	}
	for _, d := range deps {
		if d.ImportPath == libvirtModule {
			t.Errorf("understudy links %s (imported by %v): reach libvirt through libvirt.DriverProcess (the understudy-libvirt process) instead", libvirtModule, linksLibvirt(deps))
		}
		if !d.Standard && len(d.CgoFiles) > 0 {
			t.Errorf("understudy links %s, which uses cgo (%v): understudy must build with CGO_ENABLED=0", d.ImportPath, d.CgoFiles)
		}
	}
	// The check sees libvirt where it is linked.
	if importers := linksLibvirt(listDeps(t, "understudy/cmd/understudy-libvirt")); !contains(importers, "understudy/actors/resources/libvirt/direct") {
		t.Fatalf("understudy-libvirt's %s importers: %v; the check would prove nothing", libvirtModule, importers)
	}
}
