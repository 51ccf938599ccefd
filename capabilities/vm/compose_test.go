package vm

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// A pair is composed over capability.Workload, and the compiler checks
// it: a workload lacking one method does not compile as one, whether
// assigned to the interface or passed as a pair's type parameter
// (testdata/lacking has every method but Rejoin). testdata/complete, the
// same program over *VM, is the control: it compiles, so lacking fails for
// the method it lacks. The go tool inherits GOFLAGS (-tags=libvirt_dlopen).
func TestWorkloadLackingRejoinDoesNotCompile(t *testing.T) {
	goTool, err := exec.LookPath("go")
	if err != nil {
		t.Fatalf("the go tool is not in PATH: %v", err)
	}
	build := func(dir string) (string, error) {
		out, err := exec.Command(goTool, "build", "-o", os.DevNull, "./testdata/"+dir).CombinedOutput()
		return string(out), err
	}
	if out, err := build("complete"); err != nil {
		t.Fatalf("the control, testdata/complete, does not compile: %v\n%s", err, out)
	}
	out, err := build("lacking")
	if err == nil {
		t.Fatal("testdata/lacking compiled: a workload without Rejoin passed for a capability.Workload")
	}
	if n := strings.Count(out, "missing method Rejoin"); n != 2 {
		t.Fatalf("go build testdata/lacking: %v; want \"missing method Rejoin\" for the interface value and the type parameter, got %d:\n%s", err, n, out)
	}
}
