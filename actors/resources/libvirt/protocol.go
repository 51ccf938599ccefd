package libvirt

import (
	"errors"
	"fmt"
)

// The protocol between understudy and the understudy-libvirt process:
// net/rpc with its gob codec, on the process's stdin and stdout (or on a
// unix socket, understudy-libvirt --listen). Each Hypervisor method is one
// call, ServiceName + "." + the method's name, taking a *Request and
// filling a *Reply; calls are multiplexed, so they run concurrently. A
// libvirt failure travels in Reply.Err, so that errors.Is still finds
// ErrNotFound, ErrNotOwned, ErrLibraryMissing and ErrClosed on the
// caller's side.

// ServiceName is the net/rpc service understudy-libvirt registers.
const ServiceName = "Libvirt"

// ProtocolVersion changes whenever Request, Reply or the methods change in
// a way the other side would misread; understudy-libvirt refuses a request
// of another version, with a message saying to install the matching one.
const ProtocolVersion = 2 // 2: ownership markers (VM.Owner, Network.Owner, Request.Owner)

// Request is the argument of every call; each method reads the fields it
// needs.
type Request struct {
	Protocol int
	URI      string
	// Fresh: the call opens its own connection and closes it after
	// (Connector.Fresh); else it uses the process's connection to URI.
	Fresh     bool
	Name      string // the domain or network (DomainStatus, Start, …)
	VM        *VM    // EnsureVM
	State     string // EnsureVM
	Network   *Network
	Autostart bool   // EnsureVM, EnsureNetwork
	NIC       NICRef // SetLink
	Up        bool   // SetLink
	Owner     Owner  // DeleteVM, DeleteNetwork
}

// Reply is the result of every call; each method fills the fields it
// returns.
type Reply struct {
	Domain     DomainStatus
	Network    NetworkStatus
	Link       LinkResult
	WasRunning bool
	Err        *WireError // nil: the call succeeded
}

// WireError is an error as it crosses the process boundary: its message,
// and which of this package's sentinel errors it wraps.
type WireError struct {
	Message string
	Is      string // "not_found", "not_owned", "library_missing", "closed" or ""
}

var wireSentinels = map[string]error{"not_found": ErrNotFound, "not_owned": ErrNotOwned, "library_missing": ErrLibraryMissing, "closed": ErrClosed}

// ToWire encodes err for a Reply; nil for nil.
func ToWire(err error) *WireError {
	if err == nil {
		return nil
	}
	w := &WireError{Message: err.Error()}
	for name, sentinel := range wireSentinels {
		if errors.Is(err, sentinel) {
			w.Is = name
		}
	}
	return w
}

// Err decodes the error: its text is the message, and errors.Is finds the
// sentinel it wrapped.
func (w *WireError) Err() error {
	if w == nil {
		return nil
	}
	return &remoteError{msg: w.Message, is: wireSentinels[w.Is]}
}

type remoteError struct {
	msg string
	is  error
}

func (e *remoteError) Error() string { return e.msg }
func (e *remoteError) Unwrap() error { return e.is }

// CheckProtocol returns the error for a request of another protocol
// version (understudy-libvirt calls it on every request).
func CheckProtocol(req *Request) error {
	if req.Protocol == ProtocolVersion {
		return nil
	}
	return fmt.Errorf("understudy-libvirt speaks protocol %d, its caller %d: install the understudy-libvirt built with this understudy (make build puts both in bin/)", ProtocolVersion, req.Protocol)
}
