package direct

import (
	"context"
	"io"
	"log/slog"
	"net"
	"net/rpc"

	"understudy/actors/resources/libvirt"
)

// Service is the net/rpc service understudy-libvirt serves under
// libvirt.ServiceName: each method runs the libvirt.Hypervisor method of
// the same name on the connection's own Conns, and puts its error in the
// reply (libvirt.WireError). Calls carry no deadline: the caller kills the
// process when its context ends, the only way to stop a libvirt call.
type Service struct{ conns *Conns }

func (s *Service) serve(req *libvirt.Request, reply *libvirt.Reply, op func(context.Context, libvirt.Hypervisor) error) error {
	if err := libvirt.CheckProtocol(req); err != nil {
		reply.Err = libvirt.ToWire(err)
		return nil
	}
	hv := s.conns.Hypervisor(req.URI)
	if req.Fresh {
		hv = s.conns.Fresh(req.URI)
	}
	reply.Err = libvirt.ToWire(op(context.Background(), hv))
	return nil
}

// DomainStatus serves libvirt.Hypervisor.DomainStatus.
func (s *Service) DomainStatus(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) (err error) {
		reply.Domain, err = hv.DomainStatus(ctx, req.Name)
		return err
	})
}

// EnsureVM serves libvirt.Hypervisor.EnsureVM.
func (s *Service) EnsureVM(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) (err error) {
		if req.VM == nil {
			return errMissing("VM")
		}
		reply.Domain, err = hv.EnsureVM(ctx, req.VM, req.State, req.Autostart)
		return err
	})
}

// Start serves libvirt.Hypervisor.Start.
func (s *Service) Start(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) error { return hv.Start(ctx, req.Name) })
}

// Shutdown serves libvirt.Hypervisor.Shutdown.
func (s *Service) Shutdown(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) error { return hv.Shutdown(ctx, req.Name) })
}

// Destroy serves libvirt.Hypervisor.Destroy.
func (s *Service) Destroy(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) (err error) {
		reply.WasRunning, err = hv.Destroy(ctx, req.Name)
		return err
	})
}

// Undefine serves libvirt.Hypervisor.Undefine.
func (s *Service) Undefine(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) error { return hv.Undefine(ctx, req.Name) })
}

// DeleteVM serves libvirt.Hypervisor.DeleteVM.
func (s *Service) DeleteVM(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) error { return hv.DeleteVM(ctx, req.Name, req.Owner) })
}

// SetLink serves libvirt.Hypervisor.SetLink.
func (s *Service) SetLink(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) (err error) {
		reply.Link, err = hv.SetLink(ctx, req.Name, req.NIC, req.Up)
		return err
	})
}

// NetworkStatus serves libvirt.Hypervisor.NetworkStatus.
func (s *Service) NetworkStatus(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) (err error) {
		reply.Network, err = hv.NetworkStatus(ctx, req.Name)
		return err
	})
}

// EnsureNetwork serves libvirt.Hypervisor.EnsureNetwork.
func (s *Service) EnsureNetwork(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) (err error) {
		if req.Network == nil {
			return errMissing("Network")
		}
		reply.Network, err = hv.EnsureNetwork(ctx, req.Network, req.Autostart)
		return err
	})
}

// DeleteNetwork serves libvirt.Hypervisor.DeleteNetwork.
func (s *Service) DeleteNetwork(req *libvirt.Request, reply *libvirt.Reply) error {
	return s.serve(req, reply, func(ctx context.Context, hv libvirt.Hypervisor) error {
		return hv.DeleteNetwork(ctx, req.Name, req.Owner)
	})
}

type errMissing string

func (e errMissing) Error() string { return "understudy-libvirt: the request has no " + string(e) }

// ServeConn serves one connection (understudy-libvirt: its stdin and
// stdout) until the other side closes it, on libvirt connections of its
// own, which it closes before returning — after every call it received
// has returned.
func ServeConn(conn io.ReadWriteCloser, logger *slog.Logger) {
	conns := NewConns(logger)
	defer conns.Close()
	srv := rpc.NewServer()
	if err := srv.RegisterName(libvirt.ServiceName, &Service{conns: conns}); err != nil {
		panic("direct: " + err.Error()) // Service's methods do not fit net/rpc: a programming error
	}
	srv.ServeConn(conn)
}

// Serve serves every connection ln accepts (ServeConn, each on its own
// libvirt connections) until ln is closed; it returns Accept's error.
func Serve(ln net.Listener, logger *slog.Logger) error {
	for {
		c, err := ln.Accept()
		if err != nil {
			return err
		}
		go ServeConn(c, logger)
	}
}
