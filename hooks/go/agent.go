package livecov

// The running instance: snapshots of the counters (a reset keeps the
// counters of that moment as the baseline that later dumps subtract, so a
// dump-and-reset loses and repeats nothing), the files in LIVECOV_DIR, the
// periodic and final reports.

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"runtime/coverage"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

type agent struct {
	cfg      *config
	instance string
	started  time.Time
	rawMeta  []byte
	meta     *meta
	model    *model

	// mu serialises snapshots: a baseline changes between two dumps only.
	mu       sync.Mutex
	baseline map[funcKey][]uint32
	preamble []byte // a counter file's segment preamble, as the runtime writes it

	unix     net.Listener   // nil without LIVECOV_DIR
	limit    chan struct{}  // a slot per open connection
	tcp      net.Listener   // nil without LIVECOV_LISTEN
	reportMu sync.Mutex     // one report or metadata write at a time
	signals  chan os.Signal // SIGTERM and SIGINT, taken for the final report
}

// snapshot reads the counters now, less the baseline; with reset, they
// become the baseline.
func (a *agent) snapshot(reset bool) (map[funcKey][]uint32, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	var b bytes.Buffer
	if err := coverage.WriteCounters(&b); err != nil {
		return nil, fmt.Errorf("cannot read this program's coverage counters: %v", err)
	}
	cd, err := decodeCounters(b.Bytes())
	if err != nil {
		return nil, fmt.Errorf("cannot decode this program's coverage counters: %v", err)
	}
	a.preamble = cd.preamble
	delta := make(map[funcKey][]uint32, len(cd.counters))
	for key, now := range cd.counters {
		base := a.baseline[key]
		d := make([]uint32, len(now))
		for i, v := range now {
			if i < len(base) {
				v -= base[i] // modulo 2^32, as the counters themselves wrap
			}
			d[i] = v
		}
		delta[key] = d
	}
	if reset {
		a.baseline = cd.counters
	}
	return delta, nil
}

func (a *agent) lcovNow(test string, reset bool) ([]byte, error) {
	counters, err := a.snapshot(reset)
	if err != nil {
		return nil, err
	}
	return a.model.lcov(a.model.count(counters), test), nil
}

// covdata is `?format=covdata`: a tar of the meta-data file and a counter
// file of this moment, as the runtime would write them into GOCOVERDIR.
func (a *agent) covdata(reset bool) ([]byte, error) {
	counters, err := a.snapshot(reset)
	if err != nil {
		return nil, err
	}
	a.mu.Lock()
	preamble := a.preamble
	a.mu.Unlock()
	keys := make([]funcKey, 0, len(counters))
	for k := range counters {
		keys = append(keys, k)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].pkg < keys[j].pkg || (keys[i].pkg == keys[j].pkg && keys[i].fn < keys[j].fn)
	})
	data := encodeCounters(a.meta.hash, preamble, keys, counters)
	now := time.Now()
	var out bytes.Buffer
	w := tar.NewWriter(&out)
	for _, f := range []struct {
		name string
		data []byte
	}{
		{fmt.Sprintf("covmeta.%x", a.meta.hash), a.rawMeta},
		{fmt.Sprintf("covcounters.%x.%d.%d", a.meta.hash, os.Getpid(), now.UnixNano()), data},
	} {
		hdr := &tar.Header{Name: f.name, Mode: 0o644, Size: int64(len(f.data)), ModTime: now.Truncate(time.Second), Typeflag: tar.TypeReg}
		if err := w.WriteHeader(hdr); err != nil {
			return nil, err
		}
		if _, err := w.Write(f.data); err != nil {
			return nil, err
		}
	}
	if err := w.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

func (a *agent) socketPath() string {
	return filepath.Join(a.cfg.dir, "sockets", a.instance+".sock")
}

func (a *agent) reportPath(ext string) string {
	return filepath.Join(a.cfg.dir, "reports", a.instance+"."+ext)
}

// run opens the listeners, writes the metadata and serves until the process ends.
func (a *agent) run() error {
	if a.cfg.dir != "" {
		for _, sub := range []string{"sockets", "reports"} {
			if err := os.MkdirAll(filepath.Join(a.cfg.dir, sub), 0o755); err != nil {
				return fmt.Errorf("cannot make %s: %v", filepath.Join(a.cfg.dir, sub), err)
			}
		}
	}
	if a.cfg.dir != "" {
		endReplacedInstances(a.cfg.dir)
	}
	// Before the socket, which tells clients the instance is there: a
	// SIGTERM from then on gets its final report.
	a.watchSignals()
	if err := a.listen(); err != nil {
		signal.Stop(a.signals)
		return err
	}
	a.writeMetadata("running")
	if a.cfg.flush > 0 && a.cfg.dir != "" {
		go func() {
			for range time.Tick(a.cfg.flush) {
				a.writeReport()
			}
		}()
	}
	a.limit = make(chan struct{}, maxConnections)
	if a.tcp != nil {
		go a.serve(a.tcp, true)
	}
	if a.unix != nil {
		go a.serve(a.unix, false)
	}
	return nil
}

// endReplacedInstances ends the instances of this process that an earlier
// program of it left running in dir: a program that ran this one in its
// place (syscall.Exec, as gosu does and servers that execute themselves
// again) took its instance's goroutines with it, and its socket stayed
// where nothing answers. Such an instance's metadata says "exited", with
// "exec" this program, and its socket goes; one that wrote no report
// leaves no file. An instance of this pid that started before this
// process did was another process's, whose pid this one was given: it is
// left alone. The C shim does the same for the programs it is preloaded
// into.
func endReplacedInstances(dir string) {
	entries, err := os.ReadDir(filepath.Join(dir, "sockets"))
	if err != nil {
		return
	}
	pid := os.Getpid()
	pidText := strconv.Itoa(pid)
	for _, e := range entries {
		instance, ok := strings.CutSuffix(e.Name(), ".sock")
		parts := strings.SplitN(instance, "-", 3)
		if !ok || len(parts) != 3 || parts[1] != pidText {
			continue
		}
		meta := filepath.Join(dir, "reports", instance+".json")
		raw, err := os.ReadFile(meta)
		var doc map[string]any
		if err != nil || json.Unmarshal(raw, &doc) != nil {
			continue
		}
		if doc["pid"] != float64(pid) || doc["state"] != "running" {
			continue
		}
		// Read only for an instance of this pid: most starts have none.
		start, _ := doc["start_time"].(float64)
		if started, known := processStart(); !known || int64(start) < started {
			continue
		}
		doc["state"] = "exited"
		doc["exec"], _ = os.Executable()
		out, err := json.Marshal(doc)
		if err != nil || writeFile(meta, out) != nil {
			continue
		}
		os.Remove(filepath.Join(dir, "sockets", e.Name()))
		// The metadata last: a collection meanwhile sees an instance that
		// exited, without a report.
		report := filepath.Join(dir, "reports", instance+".lcov")
		counters := filepath.Join(dir, "reports", instance+".counters")
		if isEmpty(report) && isEmpty(counters) {
			for _, f := range []string{report, counters, meta} {
				os.Remove(f)
			}
		}
	}
}

// isEmpty tells whether path is missing or has no bytes.
func isEmpty(path string) bool {
	info, err := os.Stat(path)
	return err != nil || info.Size() == 0
}

// processStart is when this process started, in Unix seconds: field 22 of
// /proc/self/stat (clock ticks after the boot, USER_HZ of them a second,
// 100 on Linux) after btime in /proc/stat.
func processStart() (int64, bool) {
	stat, err := os.ReadFile("/proc/self/stat")
	if err != nil {
		return 0, false
	}
	// Fields after the command name, which may hold spaces and parentheses.
	end := bytes.LastIndexByte(stat, ')')
	if end < 0 {
		return 0, false
	}
	fields := strings.Fields(string(stat[end+1:]))
	if len(fields) < 20 {
		return 0, false
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return 0, false
	}
	boot, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0, false
	}
	for _, line := range strings.Split(string(boot), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			secs, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return secs + ticks/100, err == nil
		}
	}
	return 0, false
}

// listen opens the socket in LIVECOV_DIR and the TCP address, as configured.
func (a *agent) listen() error {
	if a.cfg.dir != "" {
		l, err := a.listenUnix()
		if err != nil {
			return err
		}
		a.unix = l
	}
	if a.cfg.listen != "" {
		l, err := net.Listen("tcp", a.cfg.listen)
		if err != nil {
			if a.unix != nil {
				a.unix.Close()
				os.Remove(a.socketPath())
			}
			return fmt.Errorf("cannot listen on LIVECOV_LISTEN=%q: %v", a.cfg.listen, err)
		}
		a.tcp = l
	}
	return nil
}

// listenUnix binds the instance's socket with its mode. A socket address
// holds 107 bytes; a deeper path is bound through the folder's descriptor.
func (a *agent) listenUnix() (net.Listener, error) {
	path := a.socketPath()
	addr := path
	if len(path) > 107 {
		dir, err := os.Open(filepath.Dir(path))
		if err != nil {
			return nil, fmt.Errorf("cannot open %s: %v", filepath.Dir(path), err)
		}
		// Kept open: the address names the descriptor for the process's lifetime.
		addr = fmt.Sprintf("/proc/self/fd/%d/%s", dir.Fd(), filepath.Base(path))
	}
	os.Remove(path)
	l, err := net.Listen("unix", addr)
	if err != nil {
		return nil, fmt.Errorf("cannot listen on %s: %v", path, err)
	}
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	if err := os.Chmod(path, a.cfg.socketMode); err != nil {
		l.Close()
		return nil, fmt.Errorf("cannot set the mode of %s: %v", path, err)
	}
	return l, nil
}

func (a *agent) metadata(state string) []byte {
	program, err := os.Executable()
	if err != nil {
		program = os.Args[0]
	}
	var tcp any
	if a.tcp != nil {
		tcp = a.tcp.Addr().String()
	}
	packages := make([]string, 0, len(a.meta.packages))
	for _, p := range a.meta.packages {
		packages = append(packages, p.path)
	}
	b, _ := json.Marshal(map[string]any{ // maps of strings, numbers and slices always marshal
		"instance":        a.instance,
		"pid":             os.Getpid(),
		"ppid":            os.Getppid(),
		"runtime":         "go",
		"livecov_version": Version,
		"program":         program,
		"build_id":        nil,
		"modules":         packages,
		"tcp":             tcp,
		"start_time":      a.started.Unix(),
		"uptime_secs":     time.Since(a.started).Seconds(),
		"state":           state,
		"go":              runtime.Version(),
	})
	return b
}

func (a *agent) writeMetadata(state string) {
	if a.cfg.dir == "" {
		return
	}
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	a.write(a.reportPath("json"), a.metadata(state))
}

// writeReport writes reports/<instance>.lcov with the counts since start
// or the last reset.
func (a *agent) writeReport() {
	if a.cfg.dir == "" {
		return
	}
	lcov, err := a.lcovNow("", false)
	if err != nil {
		say("report not written: %v", err)
		return
	}
	a.reportMu.Lock()
	defer a.reportMu.Unlock()
	a.write(a.reportPath("lcov"), lcov)
}

// write puts data into path (see writeFile), or says why it cannot.
func (a *agent) write(path string, data []byte) {
	if err := writeFile(path, data); err != nil {
		say("cannot write %s: %v", path, err)
	}
}

// writeFile puts data into path through a temporary name: a reader never
// sees a torn file.
func writeFile(path string, data []byte) error {
	tmp := fmt.Sprintf("%s.tmp-%d", path, os.Getpid())
	err := os.WriteFile(tmp, data, 0o644)
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
	}
	return err
}

// watchSignals takes SIGTERM and SIGINT for the final report. Signals the
// process started with ignored stay ignored (Notify would undo that).
func (a *agent) watchSignals() {
	var sigs []os.Signal
	for _, s := range []os.Signal{syscall.SIGTERM, syscall.SIGINT} {
		if !signal.Ignored(s) {
			sigs = append(sigs, s)
		}
	}
	if len(sigs) == 0 {
		return
	}
	ch := make(chan os.Signal, 1)
	a.signals = ch
	signal.Notify(ch, sigs...)
	go func() {
		sig := (<-ch).(syscall.Signal)
		// From here the signal has the action it would have without the
		// hook: the runtime's default, or the program's own Notify.
		signal.Stop(ch)
		a.writeReport()
		a.writeMetadata("exited")
		if a.unix != nil {
			os.Remove(a.socketPath())
		}
		syscall.Kill(os.Getpid(), sig)
		// Still running: the program takes the signal itself, and will end
		// when it decides to. The instance lives on until then. While the
		// signal is pending, no thread has taken it yet (on a loaded
		// machine, one may wait long to run): it may still end the
		// process, and a socket made again would be left behind.
		waitTaken(sig)
		time.Sleep(200 * time.Millisecond)
		if a.unix != nil {
			if l, err := a.listenUnix(); err == nil {
				old := a.unix
				a.unix = l
				old.Close()
				go a.serve(l, false)
			}
		}
		a.writeMetadata("running")
		a.reportWhileStopping()
	}()
}

// waitTaken waits until sig, sent to the process, is no longer pending
// (a thread took it), 10 s at most.
func waitTaken(sig syscall.Signal) {
	for end := time.Now().Add(10 * time.Second); pending(sig) && time.Now().Before(end); {
		time.Sleep(5 * time.Millisecond)
	}
}

// pending tells whether sig is pending for the process (false when that
// cannot be read).
func pending(sig syscall.Signal) bool {
	status, err := os.ReadFile("/proc/self/status")
	return err == nil && pendingIn(string(status), sig)
}

// pendingIn tells whether a process's status (as /proc/PID/status) has sig
// pending for the whole process (ShdPnd, in hexadecimal, bit sig-1).
func pendingIn(status string, sig syscall.Signal) bool {
	for _, line := range strings.Split(status, "\n") {
		if mask, ok := strings.CutPrefix(line, "ShdPnd:"); ok {
			bits, err := strconv.ParseUint(strings.TrimSpace(mask), 16, 64)
			return err == nil && bits&(1<<(uint(sig)-1)) != 0
		}
	}
	return false
}

// reportWhileStopping writes the report every 100 ms for a minute (at most
// a tenth of the time: a slower report waits longer), for a program that
// took SIGTERM or SIGINT itself and is presumably shutting down: Go lets
// no library run at its exit, so the last of these is its final report.
func (a *agent) reportWhileStopping() {
	if a.cfg.dir == "" {
		return
	}
	for end := time.Now().Add(time.Minute); time.Now().Before(end); {
		start := time.Now()
		a.writeReport()
		time.Sleep(max(100*time.Millisecond, 10*time.Since(start)))
	}
}
