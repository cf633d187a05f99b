package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"slices"
	"strconv"
	"syscall"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"

	"github.com/plugd/plugd/api"
)

// look is what Check saw of one socket itself.
type look struct {
	sock, endpoint dial
	health         string // what the advertised health service answered, if it is missing
	file           file
	self           string // plugd's user and groups, for permission findings
}

// dial is the outcome of connecting to a unix socket.
type dial struct {
	kind dialKind
	err  string
}

type dialKind int

const (
	dialSkipped dialKind = iota
	dialOK
	dialRefused // a socket file nobody listens on
	dialDenied  // permission
	dialGone    // no such file
	dialFailed  // anything else
)

// file is a socket file's owner, mode and time.
type file struct {
	owner, mode string
	modTime     time.Time
}

// lookAt takes the looks p calls for: its socket when it does not answer,
// its endpoint and its health service when it does.
func lookAt(ctx context.Context, p *Target) look {
	var l look
	if fi, err := os.Lstat(p.Socket); err == nil {
		l.file = file{owner: ownerOf(fi), mode: fi.Mode().String(), modTime: fi.ModTime()}
	}
	if !p.Answering {
		l.sock = dialUnix(ctx, p.Socket)
		if l.sock.kind == dialDenied {
			l.self = self()
		}
		return l
	}
	if p.Endpoint != "" && p.Endpoint != p.Socket {
		l.endpoint = dialUnix(ctx, p.Endpoint)
	}
	if p.Type == api.DRAPlugin && l.endpoint.kind != dialRefused && l.endpoint.kind != dialGone {
		l.health = missingHealth(ctx, p)
	}
	return l
}

func dialUnix(ctx context.Context, path string) dial {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	var d net.Dialer
	c, err := d.DialContext(ctx, "unix", path)
	if err == nil {
		c.Close()
		return dial{kind: dialOK}
	}
	out := dial{kind: dialFailed, err: err.Error()}
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		out.kind = dialRefused
	case errors.Is(err, os.ErrPermission):
		out.kind = dialDenied
	case errors.Is(err, os.ErrNotExist):
		out.kind = dialGone
	}
	return out
}

// missingHealth asks the DRA health service p advertises for its stream,
// and says what it answered if that is "not implemented". A driver that
// implements it may send nothing for a while: that is fine.
func missingHealth(ctx context.Context, p *Target) string {
	v1, v1alpha1 := slices.Contains(p.Versions, drahealthv1.DRAResourceHealthService), slices.Contains(p.Versions, drahealthv1alpha1.DRAResourceHealthService)
	if !v1 && !v1alpha1 {
		return ""
	}
	conn, err := grpc.NewClient("unix:"+p.Endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return ""
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	var recv func() error
	if v1 {
		s, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
		if err != nil {
			recv = func() error { return err }
		} else {
			recv = func() error { _, err := s.Recv(); return err }
		}
	} else {
		s, err := drahealthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1alpha1.NodeWatchResourcesRequest{})
		if err != nil {
			recv = func() error { return err }
		} else {
			recv = func() error { _, err := s.Recv(); return err }
		}
	}
	if err := recv(); status.Code(err) == codes.Unimplemented {
		return status.Convert(err).Message() + " (Unimplemented)"
	}
	return ""
}

// self names plugd's user and groups.
func self() string {
	s := "uid " + describeID(strconv.Itoa(os.Geteuid()), true) + ", gid " + describeID(strconv.Itoa(os.Getegid()), false)
	if gs, err := os.Getgroups(); err == nil && len(gs) > 0 {
		s += fmt.Sprintf(", groups %v", gs)
	}
	return s
}

// describeID is a uid or gid with its name, if it has one.
func describeID(id string, isUser bool) string {
	if isUser {
		if u, err := user.LookupId(id); err == nil {
			return id + " (" + u.Username + ")"
		}
	} else if g, err := user.LookupGroupId(id); err == nil {
		return id + " (" + g.Name + ")"
	}
	return id
}
