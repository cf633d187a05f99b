package plugin

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

// maxSocketPath is the size of sun_path in struct sockaddr_un on Linux. The
// kernel wants room for a NUL terminator, so usable paths are shorter.
const maxSocketPath = 108

// gracePeriod bounds how long Close lets in-flight RPCs finish before it
// forces the server down. Without a bound, a streaming RPC of a service added
// through Config.Services (a device plugin's ListAndWatch, for instance)
// would keep Close waiting forever. (A Server's grace, which tests shorten.)
const gracePeriod = 5 * time.Second

// Config describes a plugin and where its registration socket goes.
type Config struct {
	Dir      string // registry directory the manager watches; required
	Socket   string // file name of the socket inside Dir; zero means Name + ".sock" (must be a plain file name, not a path, not starting with '.')
	Type     string // e.g. "CSIPlugin", "DRAPlugin", "DevicePlugin" or a custom type; required
	Name     string // required
	Endpoint string // zero means the registration socket itself (the manager substitutes it)
	// Versions are the versions of its type's API the plugin speaks, in
	// its order of preference (CSI: "1.0.0"; DRA: "v1.DRAPlugin"; device
	// plugins: "v1beta1"); required: plugd's handlers, "accept" included,
	// and the kubelet's refuse a plugin that lists none.
	Versions []string
	// Services, if set, is called with the gRPC server before it starts serving,
	// so a plugin can serve its own services (e.g. a device plugin) on the same socket.
	Services func(grpc.ServiceRegistrar)
	// OnStatus, if set, is called (synchronously, from the gRPC handler) with every
	// status the manager sends. Calls are serialised and arrive in the order
	// the statuses were recorded. It must return promptly and must not call
	// Close: Close waits for the handler it runs in.
	OnStatus func(Status)
	Logger   *slog.Logger // nil: discard
}

// Status is what the manager told the plugin.
type Status struct {
	Registered bool
	Error      string // the manager's reason when Registered is false
	Time       time.Time
}

// Server serves the Registration service for one plugin. Create it with
// Start or Serve; its methods are safe for concurrent use.
type Server struct {
	path     string
	typ      string
	name     string
	endpoint string
	versions []string
	onStatus func(Status)
	log      *slog.Logger
	grace    time.Duration

	grpc *grpc.Server
	// socket identifies the inode this Server created, so Close can tell it
	// apart from a successor's socket at the same path.
	socket os.FileInfo
	// private is the hidden directory the socket was made in (see Start),
	// removed by Close.
	private  string
	served   chan struct{} // closed when the serve goroutine returns
	serveErr error         // set before served is closed

	closed    chan struct{} // closed when Close starts; releases WaitRegistered
	closeOnce sync.Once
	closeErr  error

	// notifyMu spans recording a status and running OnStatus, so callbacks
	// observe statuses in the order they were recorded. It is separate from
	// mu so that OnStatus may call the Server's getters.
	notifyMu sync.Mutex

	mu            sync.Mutex
	status        Status
	hasStatus     bool
	notifications int
	// changed is closed and replaced on every status, waking all waiters at
	// once without polling.
	changed chan struct{}
}

// ErrInUse is returned, wrapped, by Start when a plugin answers on the
// socket's path: another instance of the plugin, most likely, which must
// stop (and remove its socket) before this one takes the name.
var ErrInUse = errors.New("is in use")

// Start validates cfg, creates the registration socket and starts serving on
// it. The socket becomes visible under its final name only once it is
// listening. A socket left at the path by an earlier run is replaced; one a
// plugin still answers on is not: Start returns an error wrapping ErrInUse.
// Call Close to stop.
//
// The socket is made in a hidden directory of its own inside Config.Dir
// (.NAME.sock.XXXXXXXX.d, mode 0700, removed by Close) and linked into
// place once it listens. Managers skip hidden names, and a kubelet watches
// neither the hidden directory nor what is in it, so the only name it sees
// created is the socket's, already accepting connections. (A hidden
// socket made in Config.Dir itself is seen too: the kubelet looks at
// every name created there before it skips hidden ones, and logs an error
// for one renamed away before it looked.)
func Start(cfg Config) (*Server, error) {
	socketName, err := cfg.socketName()
	if err != nil {
		return nil, err
	}
	dir, err := filepath.Abs(cfg.Dir)
	if err != nil {
		return nil, fmt.Errorf("plugin: resolving Config.Dir %q: %w", cfg.Dir, err)
	}
	path := filepath.Join(dir, socketName)
	if len(path) >= maxSocketPath {
		return nil, fmt.Errorf("plugin: socket path %q is %d bytes, but unix socket paths must be shorter than %d bytes; use a shorter Config.Dir or Config.Socket",
			path, len(path), maxSocketPath)
	}
	private, err := privateDirPath(dir, socketName)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(dir, 0o750); err != nil {
		return nil, fmt.Errorf("plugin: creating registry directory Config.Dir: %w", err)
	}
	if err := removeStaleSocket(path); err != nil {
		return nil, err
	}
	removeLeftovers(dir, socketName)
	if err := os.Mkdir(private, 0o700); err != nil {
		return nil, fmt.Errorf("plugin: creating the directory the socket is made in: %w", err)
	}
	tmpPath := filepath.Join(private, ".s")

	log := cfg.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s := &Server{
		path:     path,
		typ:      cfg.Type,
		name:     cfg.Name,
		endpoint: cfg.Endpoint,
		versions: slices.Clone(cfg.Versions), // the caller may reuse its slice
		onStatus: cfg.OnStatus,
		log:      log.With("plugin", cfg.Name, "socket", path),
		grace:    gracePeriod,
		grpc:     grpc.NewServer(),
		private:  private,
		served:   make(chan struct{}),
		closed:   make(chan struct{}),
		changed:  make(chan struct{}),
	}
	registerapi.RegisterRegistrationServer(s.grpc, &registrationService{s: s})
	if cfg.Services != nil {
		cfg.Services(s.grpc)
	}

	lis, id, err := listenUnix(tmpPath)
	if err != nil {
		s.grpc.Stop()
		os.Remove(private)
		return nil, err
	}
	s.socket = id
	go s.serve(lis)

	// The manager either sees no socket or one that already accepts
	// connections. A link fails, where a rename would replace, if another
	// instance took the name since removeStaleSocket looked.
	if err := moveIntoPlace(tmpPath, path); err != nil {
		s.grpc.Stop()
		<-s.served
		removeIfSame(tmpPath, id)
		os.Remove(private)
		if errors.Is(err, fs.ErrExist) {
			return nil, inUse(path)
		}
		return nil, fmt.Errorf("plugin: moving socket into place at %s: %w", path, err)
	}
	s.log.Info("plugin registration socket listening")
	return s, nil
}

// moveIntoPlace gives the socket at tmp the name path, unless path exists
// (an error wrapping fs.ErrExist). Where the file system makes no hard link
// of a socket, it renames, which replaces.
func moveIntoPlace(tmp, path string) error {
	err := os.Link(tmp, path)
	switch {
	case err == nil:
		return os.Remove(tmp)
	case errors.Is(err, fs.ErrExist):
		return err
	}
	return os.Rename(tmp, path)
}

func inUse(path string) error {
	return fmt.Errorf("plugin: %s %w: a plugin answers on it (another instance of this one?); stop it first, or set Config.Socket to another name", path, ErrInUse)
}

// Serve is Start, then blocks until ctx is done, then Close. It returns nil
// when ctx is cancelled and the server shut down cleanly.
func Serve(ctx context.Context, cfg Config) error {
	s, err := Start(cfg)
	if err != nil {
		return err
	}
	select {
	case <-ctx.Done():
		return s.Close()
	case <-s.served:
		// Only a listener failure ends serving before Close; report it
		// instead of sitting on a dead socket until ctx is done.
		serveErr := s.serveErr
		if serveErr == nil {
			serveErr = errors.New("stopped without an error")
		}
		return errors.Join(fmt.Errorf("plugin: gRPC server for %s failed: %w", s.path, serveErr), s.Close())
	}
}

// Path returns the absolute path of the registration socket.
func (s *Server) Path() string { return s.path }

// Registered reports whether the last status received said registered.
func (s *Server) Registered() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.hasStatus && s.status.Registered
}

// Status returns the last status received, and false if none arrived yet.
func (s *Server) Status() (Status, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.status, s.hasStatus
}

// Notifications returns how many NotifyRegistrationStatus calls were received.
func (s *Server) Notifications() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.notifications
}

// WaitRegistered blocks until the manager reports the plugin registered, and
// returns at once if the last status already did. If ctx is done first, the
// error wraps ctx's error and carries the manager's last reason, if any. It
// also returns an error once the Server is closed, as no status can arrive
// after that.
func (s *Server) WaitRegistered(ctx context.Context) error {
	for {
		s.mu.Lock()
		registered := s.hasStatus && s.status.Registered
		changed := s.changed
		s.mu.Unlock()
		if registered {
			return nil
		}
		select {
		case <-changed:
		case <-ctx.Done():
			return s.notRegistered(ctx.Err())
		case <-s.closed:
			return s.notRegistered(errors.New("server closed"))
		}
	}
}

func (s *Server) notRegistered(cause error) error {
	st, ok := s.Status()
	if ok && st.Error != "" {
		return fmt.Errorf("plugin: %s not registered, manager said %q: %w", s.name, st.Error, cause)
	}
	return fmt.Errorf("plugin: %s not registered: %w", s.name, cause)
}

// Close removes the socket if it is still the one this Server created and
// stops the gRPC server, letting in-flight calls finish for a bounded time.
// It is safe to call more than once and from several goroutines; every call
// returns the result of the first.
func (s *Server) Close() error {
	s.closeOnce.Do(func() { s.closeErr = s.shutdown() })
	return s.closeErr
}

func (s *Server) shutdown() error {
	close(s.closed)
	// Remove the socket before stopping the server: the manager then sees
	// the plugin go away rather than a file nobody answers on, and, because
	// our listener still holds the inode, it cannot have been recycled for
	// a successor's socket when removeSocket compares identities.
	err := s.removeSocket()
	s.stopGRPC()
	<-s.served
	os.Remove(s.private) // empty since the socket moved out
	s.log.Info("plugin registration socket closed")
	return err
}

func (s *Server) removeSocket() error {
	fi, err := os.Lstat(s.path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("plugin: checking socket before removal: %w", err)
	case !os.SameFile(fi, s.socket):
		s.log.Info("socket path now belongs to another server; leaving it in place")
		return nil
	}
	if err := os.Remove(s.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("plugin: removing socket: %w", err)
	}
	return nil
}

func (s *Server) stopGRPC() {
	stopped := make(chan struct{})
	go func() {
		defer close(stopped)
		s.grpc.GracefulStop()
	}()
	timer := time.NewTimer(s.grace)
	defer timer.Stop()
	select {
	case <-stopped:
	case <-timer.C:
		s.log.Warn("in-flight RPCs did not finish in time; forcing the gRPC server to stop", "grace", s.grace)
		// Stop cancels the remaining RPCs' contexts; GracefulStop returns
		// once their handlers do.
		s.grpc.Stop()
		<-stopped
	}
}

func (s *Server) serve(lis net.Listener) {
	defer close(s.served)
	if err := s.grpc.Serve(lis); err != nil {
		s.serveErr = err
		s.log.Error("gRPC server stopped", "err", err)
	}
}

// record stores a status from the manager, wakes waiters and runs OnStatus.
func (s *Server) record(st Status) {
	s.notifyMu.Lock()
	defer s.notifyMu.Unlock()

	s.mu.Lock()
	s.status = st
	s.hasStatus = true
	s.notifications++
	close(s.changed)
	s.changed = make(chan struct{})
	s.mu.Unlock()

	if st.Registered {
		s.log.Info("plugin registered by manager")
	} else {
		s.log.Warn("plugin registration rejected by manager", "reason", st.Error)
	}
	if s.onStatus != nil {
		s.onStatus(st)
	}
}

// registrationService implements the Registration gRPC service. It is a
// separate type so that its methods stay out of Server's public API.
type registrationService struct {
	registerapi.UnimplementedRegistrationServer
	s *Server
}

func (r *registrationService) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	r.s.log.Debug("GetInfo called")
	// A fresh message per call: the manager must not be able to observe or
	// race on shared state, and Versions must not alias ours.
	return &registerapi.PluginInfo{
		Type:              r.s.typ,
		Name:              r.s.name,
		Endpoint:          r.s.endpoint,
		SupportedVersions: slices.Clone(r.s.versions),
	}, nil
}

func (r *registrationService) NotifyRegistrationStatus(_ context.Context, req *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	r.s.record(Status{
		Registered: req.GetPluginRegistered(),
		Error:      req.GetError(),
		Time:       time.Now(),
	})
	return &registerapi.RegistrationStatusResponse{}, nil
}

// socketName validates cfg and returns the socket's file name.
func (cfg *Config) socketName() (string, error) {
	switch {
	case cfg.Dir == "":
		return "", errors.New("plugin: Config.Dir is required: set it to the registry directory the plugin manager watches")
	case cfg.Type == "":
		return "", errors.New(`plugin: Config.Type is required: set it to the plugin type, e.g. "CSIPlugin", "DRAPlugin" or "DevicePlugin"`)
	case cfg.Name == "":
		return "", errors.New("plugin: Config.Name is required: set it to the name that identifies the plugin to the manager")
	}
	name, field := cfg.Socket, "Config.Socket"
	if name == "" {
		name, field = cfg.Name+".sock", "the default socket name (Config.Name + \".sock\")"
	}
	switch {
	case strings.ContainsRune(name, '/') || strings.ContainsRune(name, os.PathSeparator):
		return "", fmt.Errorf("plugin: %s %q must be a plain file name inside Config.Dir, not a path; set Config.Socket to a file name", field, name)
	case strings.HasPrefix(name, "."):
		return "", fmt.Errorf("plugin: %s %q must not start with '.', because the manager ignores such files; set Config.Socket to another name", field, name)
	case strings.ContainsRune(name, 0):
		return "", fmt.Errorf("plugin: %s %q must not contain a NUL byte; set Config.Socket to another name", field, name)
	case len(cfg.Versions) == 0:
		return "", fmt.Errorf(`plugin: Config.Versions is empty: list the versions of the %s API the plugin speaks (CSI: "1.0.0"; DRA: "v1.DRAPlugin"; device plugins: "v1beta1"); plugd's handlers and the kubelet's refuse a plugin that lists none`, cfg.Type)
	}
	return name, nil
}

// privateDirPath picks the hidden directory the socket is made in. The
// name derived from the socket's is easier to trace back to its owner; the
// short form keeps long socket names within the sun_path limit, with the
// socket's own name (".s") inside.
func privateDirPath(dir, socketName string) (string, error) {
	suffix := fmt.Sprintf("%08x", rand.Uint32())
	for _, name := range []string{
		"." + socketName + "." + suffix + ".d",
		"." + suffix + ".d",
	} {
		if p := filepath.Join(dir, name); len(p)+len("/.s") < maxSocketPath {
			return p, nil
		}
	}
	return "", fmt.Errorf("plugin: Config.Dir %q is too long to hold a temporary socket within the %d-byte unix socket path limit; use a shorter Config.Dir",
		dir, maxSocketPath)
}

// dialTimeout bounds the look at a socket found at the path, and at one
// left in a hidden directory.
const dialTimeout = time.Second

// removeStaleSocket removes a socket left at path by an earlier run: one
// nobody listens on. A socket a plugin answers on is not stale (an error
// wrapping ErrInUse), and anything else at path is someone else's data,
// left alone and reported.
func removeStaleSocket(path string) error {
	fi, err := os.Lstat(path)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil
	case err != nil:
		return fmt.Errorf("plugin: checking for a stale socket: %w", err)
	case fi.Mode().Type() != fs.ModeSocket:
		return fmt.Errorf("plugin: %s exists and is not a socket (mode %v); remove it or choose another Config.Socket", path, fi.Mode())
	}
	c, err := net.DialTimeout("unix", path, dialTimeout)
	switch {
	case err == nil:
		c.Close()
		return inUse(path)
	case !refused(err):
		return fmt.Errorf("plugin: cannot tell whether a plugin answers on %s, so it is left in place: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("plugin: removing stale socket: %w", err)
	}
	return nil
}

// removeLeftovers removes what an earlier run of this plugin left when it
// died before it could clean up: its hidden directory, and the temporary
// sockets of earlier versions of this package, made in Dir itself.
// Managers ignore them, but nothing else would ever remove them. One whose
// socket still accepts connections belongs to a Start in progress
// elsewhere and is kept.
func removeLeftovers(dir, socketName string) {
	answers := func(p string) bool {
		c, err := net.DialTimeout("unix", p, dialTimeout)
		if err == nil {
			c.Close()
		}
		return err == nil
	}
	temps, _ := filepath.Glob(filepath.Join(dir, "."+socketName+".*.tmp"))
	for _, m := range temps {
		if fi, err := os.Lstat(m); err == nil && fi.Mode().Type() == fs.ModeSocket && !answers(m) {
			os.Remove(m)
		}
	}
	dirs, _ := filepath.Glob(filepath.Join(dir, "."+socketName+".*.d"))
	for _, d := range dirs {
		if fi, err := os.Lstat(d); err != nil || !fi.IsDir() || answers(filepath.Join(d, ".s")) {
			continue
		}
		os.Remove(filepath.Join(d, ".s"))
		os.Remove(d) // only if that left it empty: what else is in it is not ours
	}
}

// listenUnix listens on path and returns the listener with the identity of
// the socket file it created.
func listenUnix(path string) (net.Listener, os.FileInfo, error) {
	l, err := net.Listen("unix", path)
	if err != nil {
		return nil, nil, fmt.Errorf("plugin: listening on temporary socket: %w", err)
	}
	// By default closing the listener unlinks the name it was bound to,
	// which after the rename is no longer ours to delete; Close removes the
	// final name itself, after checking it is still ours.
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	id, err := os.Lstat(path)
	if err != nil {
		l.Close()
		os.Remove(path)
		return nil, nil, fmt.Errorf("plugin: inspecting temporary socket: %w", err)
	}
	return l, id, nil
}

// removeIfSame removes path if it is still the file described by id.
func removeIfSame(path string, id os.FileInfo) {
	if fi, err := os.Lstat(path); err == nil && os.SameFile(fi, id) {
		os.Remove(path)
	}
}
