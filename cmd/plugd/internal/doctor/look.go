package doctor

import (
	"context"
	"errors"
	"fmt"
	"net"
	"os"
	"os/user"
	"strconv"
	"sync"
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
	// health is what a DRA driver's endpoint answered when asked for
	// each version of the device health service, advertised or not.
	health map[string]healthAnswer
	file   file
	self   string // plugd's user and groups, for permission findings
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
		l.health = probeHealth(ctx, p.Endpoint)
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

// healthAnswer is what a driver answered when asked for one version of
// the DRA health service (NodeWatchResources).
type healthAnswer int

const (
	healthUnknown       healthAnswer = iota // not asked, or no answer that tells (connection trouble)
	healthServed                            // a report
	healthQuiet                             // a stream still open, with nothing to say yet, at the deadline
	healthUnimplemented                     // Unimplemented: it does not serve that version
)

// served says the driver serves the version it was asked for.
func (a healthAnswer) served() bool { return a == healthServed || a == healthQuiet }

func (a healthAnswer) String() string {
	switch a {
	case healthServed:
		return "served (it sent a report)"
	case healthQuiet:
		return fmt.Sprintf("served (the stream stayed open for %s, with nothing to report yet)", healthTimeout)
	case healthUnimplemented:
		return "Unimplemented"
	}
	return "no answer that tells"
}

// probeHealth asks the driver at endpoint for a NodeWatchResources stream
// in each version of the health service the kubelet knows, both at once,
// whether the driver advertises them or not: the kubelet's choice of
// which to ask depends on its version (draServices). A driver that
// implements a version may send nothing for a while: a stream still open
// at the deadline is served.
func probeHealth(ctx context.Context, endpoint string) map[string]healthAnswer {
	conn, err := grpc.NewClient("unix:"+endpoint, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil
	}
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, healthTimeout)
	defer cancel()
	var v1, v1alpha1 error
	var wg sync.WaitGroup
	wg.Go(func() {
		s, err := drahealthv1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1.NodeWatchResourcesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		v1 = err
	})
	wg.Go(func() {
		s, err := drahealthv1alpha1.NewDRAResourceHealthClient(conn).NodeWatchResources(ctx, &drahealthv1alpha1.NodeWatchResourcesRequest{})
		if err == nil {
			_, err = s.Recv()
		}
		v1alpha1 = err
	})
	wg.Wait()
	return map[string]healthAnswer{
		drahealthv1.DRAResourceHealthService:       answerOf(ctx, v1),
		drahealthv1alpha1.DRAResourceHealthService: answerOf(ctx, v1alpha1),
	}
}

// answerOf is what the first Recv of a health stream, err, says; ctx is
// the probe's, whose deadline ends a stream that is open and quiet.
func answerOf(ctx context.Context, err error) healthAnswer {
	switch {
	case err == nil:
		return healthServed
	case status.Code(err) == codes.Unimplemented:
		return healthUnimplemented
	case ctx.Err() != nil && status.Code(err) == codes.DeadlineExceeded:
		return healthQuiet
	}
	return healthUnknown
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
