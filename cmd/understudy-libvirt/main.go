package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"syscall"

	"understudy/actors/resources/libvirt"
	"understudy/actors/resources/libvirt/direct"
)

func main() { os.Exit(run(os.Args[1:], os.Stdin, os.Stdout, os.Stderr)) }

func run(args []string, stdin io.ReadCloser, stdout io.WriteCloser, stderr io.Writer) int {
	fs := flag.NewFlagSet(libvirt.DriverName, flag.ContinueOnError)
	fs.SetOutput(stderr)
	listen := fs.String("listen", "", "serve on this unix socket (each connection on libvirt connections of its own) instead of stdin and stdout")
	logLevel := fs.String("log-level", "info", "debug, info, warn or error")
	version := fs.Bool("version", false, "print the protocol version and the version of the libvirt.so.0 loaded, then exit")
	if err := fs.Parse(args); err != nil {
		return 2
	}
	if fs.NArg() > 0 {
		fmt.Fprintf(stderr, "%s: unexpected arguments %q\n", libvirt.DriverName, fs.Args())
		return 2
	}
	var level slog.Level
	if err := level.UnmarshalText([]byte(*logLevel)); err != nil {
		fmt.Fprintf(stderr, "%s: --log-level: %v\n", libvirt.DriverName, err)
		return 2
	}
	if *version {
		v, err := direct.LibraryVersion()
		if err != nil {
			fmt.Fprintf(stderr, "%s: %v\n", libvirt.DriverName, err)
			return 1
		}
		fmt.Fprintf(stdout, "%s protocol %d, libvirt %s\n", libvirt.DriverName, libvirt.ProtocolVersion, v)
		return 0
	}
	logger := slog.New(slog.NewJSONHandler(stderr, &slog.HandlerOptions{Level: level}))
	if *listen == "" {
		direct.ServeConn(stdio{stdin, stdout}, logger)
		return 0
	}
	ln, err := net.Listen("unix", *listen)
	if err != nil {
		logger.Error("cannot listen", "err", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	go func() {
		<-ctx.Done()
		ln.Close() // removes the socket file
	}()
	logger.Info("serving", "socket", *listen, "pid", os.Getpid())
	if err := direct.Serve(ln, logger); !errors.Is(err, net.ErrClosed) {
		logger.Error("accept", "err", err)
		return 1
	}
	return 0
}

// stdio is the connection to understudy: requests on stdin, replies on
// stdout.
type stdio struct {
	io.ReadCloser
	w io.WriteCloser
}

func (s stdio) Write(p []byte) (int, error) { return s.w.Write(p) }

func (s stdio) Close() error { return errors.Join(s.ReadCloser.Close(), s.w.Close()) }
