// Package livecov makes a Go coverage build a livecov instance: imported
// for its side effects (`import _ "livecov.dev/hooks/go"` in the main
// package) by a program built with `go build -cover -covermode=atomic`,
// it serves the program's coverage as LCOV over a Unix socket in
// LIVECOV_DIR (and TCP with LIVECOV_LISTEN), with the protocol of every
// livecov agent (docs/protocol.md), and writes reports to LIVECOV_DIR.
//
// The LCOV is computed in the process from the program's own coverage
// meta-data and counters (runtime/coverage), so a collector needs no Go
// tool and no source. Standard library only: a service adds one import and
// no dependency. Nothing happens unless LIVECOV_DIR or LIVECOV_LISTEN is
// set.
package livecov

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"runtime/coverage"
	"runtime/debug"
	"time"
)

// Version is the livecov version the metadata reports.
const Version = "0.1.0"

// goCoverDirVariable is where Go's coverage runtime writes its files.
const goCoverDirVariable = "GOCOVERDIR"

func init() {
	cfg, err := readConfig(os.Getenv)
	if err != nil {
		say("not started: %v", err)
		return
	}
	if cfg == nil {
		return
	}
	if !builtWithCover() {
		say("not started: this program was not built with -cover (build it with go build -cover -covermode=atomic)")
		return
	}
	instance := fmt.Sprintf("go-%d-%s", os.Getpid(), randomHex())
	go start(cfg, instance, claimCoverDir(cfg, instance))
}

// builtWithCover says whether the go command recorded -cover in the build.
func builtWithCover() bool {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return false
	}
	for _, s := range info.Settings {
		if s.Key == "-cover" {
			return s.Value == "true"
		}
	}
	return false
}

// claimCoverDir points GOCOVERDIR, when the program has none, at a fresh
// folder of this instance, LIVECOV_DIR/go/<instance>, before the runtime
// reads it at the end of the main package's initialisation. The runtime
// then writes the program's meta-data there, which tells the hook that
// the coverage runtime is ready, and at a normal exit (main returning,
// os.Exit) its counters: what Go itself leaves of a process that the hook
// cannot see end. "" when GOCOVERDIR is the program's own or there is no
// LIVECOV_DIR.
func claimCoverDir(cfg *config, instance string) string {
	if cfg.dir == "" || os.Getenv(goCoverDirVariable) != "" {
		return ""
	}
	dir := filepath.Join(cfg.dir, "go", instance)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return ""
	}
	if err := os.Setenv(goCoverDirVariable, dir); err != nil {
		return ""
	}
	return dir
}

// programMeta waits for the program's coverage meta-data, which the runtime
// registers at the end of the main package's initialisation, after this
// package's init.
//
// With a GOCOVERDIR of its own, the hook waits for the meta-data file the
// runtime writes there: the runtime read GOCOVERDIR just before, under the
// environment's lock, so the hook taking that lock afterwards (to put the
// environment back as the program set it) orders all the runtime's set-up
// before the hook's first call into runtime/coverage. That keeps -race
// builds free of reports. Otherwise (or if the file never comes) it asks
// runtime/coverage until it answers, which the race detector reports once.
func programMeta(coverDir string) []byte {
	wait := time.Millisecond
	if coverDir != "" {
		for deadline := time.Now().Add(time.Minute); time.Now().Before(deadline); {
			if metas, _ := filepath.Glob(filepath.Join(coverDir, "covmeta.*")); len(metas) > 0 {
				break
			}
			time.Sleep(wait)
			wait = min(2*wait, 100*time.Millisecond)
		}
		os.Unsetenv(goCoverDirVariable)
		shareMeta(coverDir)
	}
	for {
		var b bytes.Buffer
		if err := coverage.WriteMeta(&b); err == nil {
			return b.Bytes()
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

// shareMeta keeps one copy of a build's meta-data file for all its
// instances: each instance's folder holds a hard link to
// LIVECOV_DIR/go/covmeta.<hash> (a large build's meta-data is megabytes).
func shareMeta(coverDir string) {
	metas, _ := filepath.Glob(filepath.Join(coverDir, "covmeta.*"))
	for _, own := range metas {
		shared := filepath.Join(filepath.Dir(coverDir), filepath.Base(own))
		if os.Link(own, shared) == nil {
			continue
		}
		// Another instance shared it first: link to its copy instead.
		tmp := own + ".link"
		if os.Link(shared, tmp) == nil && os.Rename(tmp, own) != nil {
			os.Remove(tmp)
		}
	}
}

func start(cfg *config, instance, coverDir string) {
	raw := programMeta(coverDir)
	m, err := decodeMeta(raw)
	if err != nil {
		say("not started: cannot read this program's coverage meta-data (%v)", err)
		return
	}
	if m.mode != modeAtomic {
		if coverDir != "" {
			os.RemoveAll(coverDir)
		}
		say("not started: this program was built with -covermode=%s; the hook needs -covermode=atomic (go build -cover -covermode=atomic)", modeNames[m.mode])
		return
	}
	own := reflect.TypeOf(config{}).PkgPath()
	a := &agent{
		cfg:      cfg,
		instance: instance,
		started:  time.Now(),
		rawMeta:  raw,
		meta:     m,
		model:    newModel(m, own, cfg.ignore, cfg.pathMap),
		baseline: map[funcKey][]uint32{},
	}
	if err := a.run(); err != nil {
		say("not started: %v", err)
	}
}

func randomHex() string {
	b := make([]byte, 8)
	if _, err := rand.Read(b); err != nil {
		// An instance id needs uniqueness, not secrecy.
		now := time.Now().UnixNano()
		for i := range b {
			b[i] = byte(now >> (8 * i))
		}
	}
	return hex.EncodeToString(b)
}
