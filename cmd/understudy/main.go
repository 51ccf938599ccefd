package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"understudy/runtime"
)

// Exit codes.
const (
	exitOK      = 0
	exitFailure = 1 // the command ran and failed
	exitUsage   = 2 // bad flags or configuration: nothing was started
)

func main() {
	// SIGINT/SIGTERM cancel ctx: serve shuts down in order and exits 0.
	// A second signal kills at once (stop restores the default handling).
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop()
	}()
	os.Exit(run(ctx, os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the CLI with args and returns the exit code.
func run(ctx context.Context, args []string, stdout, stderr io.Writer) int {
	root := newRootCmd(stdout, stderr)
	root.SetArgs(args)
	started := false // set once a command's own code runs
	root.PersistentPreRun = func(*cobra.Command, []string) { started = true }
	cmd, err := root.ExecuteContextC(ctx)
	if err == nil {
		return exitOK
	}
	var usage *usageError
	if !errors.As(err, &usage) && !started {
		// cobra refused the command line: unknown command, wrong arguments.
		usage = &usageError{cmd: cmd.CommandPath(), err: err}
	}
	if usage != nil {
		fmt.Fprintf(stderr, "understudy: %v\n", usage.err)
		fmt.Fprintf(stderr, "Run '%s --help' for usage.\n", usage.cmd)
		return exitUsage
	}
	fmt.Fprintf(stderr, "understudy: %v\n", err)
	return exitFailure
}

// usageError is a mistake in the command line or configuration.
type usageError struct {
	cmd string
	err error
}

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

func newRootCmd(stdout, stderr io.Writer) *cobra.Command {
	root := &cobra.Command{
		Use:   "understudy",
		Short: "Keep PostgreSQL highly available across unreliable sites",
		Long: "understudy keeps stateful workloads (PostgreSQL first) highly available across sites\n" +
			"joined by unreliable networks: an event-sourced actor system on NATS JetStream.",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.SetOut(stdout)
	root.SetErr(stderr)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error {
		return &usageError{cmd: c.CommandPath(), err: err}
	})
	root.AddCommand(newServeCmd(stderr), newVersionCmd(stdout), newDemoCmd(stdout, stderr), newStatusCmd(stdout), newSwitchoverCmd(stdout), newPauseCmd(stdout), newResumeCmd(stdout), newLeadershipCmd(stdout), newFailoverCmd(stdout), newConfigCmd(stdout), newSimulateCmd(stdout, stderr), newExportCmd(stdout, stderr), newReplayCmd(stdout, stderr), newApplyCmd(stdout), newDeleteCmd(stdout), newGetCmd(stdout), newPingCmd(stdout), newPgKeeperCmd(), newInitCmd(stdout))
	return root
}

func newVersionCmd(stdout io.Writer) *cobra.Command {
	return &cobra.Command{
		Use:   "version",
		Short: "Print the version, Go version and VCS revision",
		Args:  cobra.NoArgs,
		RunE: func(*cobra.Command, []string) error {
			_, err := fmt.Fprintln(stdout, runtime.ReadBuildInfo())
			return err
		},
	}
}
