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
	"reflect"
	"runtime/coverage"
	"runtime/debug"
	"time"
)

// Version is the livecov version the metadata reports.
const Version = "0.1.0"

func init() {
	cfg, err := readConfig(os.Getenv)
	if err != nil {
		fmt.Fprintf(os.Stderr, "livecov: not started: %v\n", err)
		return
	}
	if cfg == nil {
		return
	}
	if !builtWithCover() {
		fmt.Fprintln(os.Stderr, "livecov: not started: this program was not built with -cover (build it with go build -cover -covermode=atomic)")
		return
	}
	go start(cfg)
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

// programMeta waits for the program's coverage meta-data. The runtime
// registers it at the end of the main package's initialisation, after
// this package's init; until then WriteMeta refuses.
func programMeta() []byte {
	wait := time.Millisecond
	for {
		var b bytes.Buffer
		if err := coverage.WriteMeta(&b); err == nil {
			return b.Bytes()
		}
		time.Sleep(wait)
		wait = min(2*wait, 100*time.Millisecond)
	}
}

func start(cfg *config) {
	raw := programMeta()
	m, err := decodeMeta(raw)
	if err != nil {
		fmt.Fprintf(os.Stderr, "livecov: not started: cannot read this program's coverage meta-data (%v)\n", err)
		return
	}
	if m.mode != modeAtomic {
		fmt.Fprintf(os.Stderr, "livecov: not started: this program was built with -covermode=%s; the hook needs -covermode=atomic (go build -cover -covermode=atomic)\n", modeNames[m.mode])
		return
	}
	own := reflect.TypeOf(config{}).PkgPath()
	a := &agent{
		cfg:      cfg,
		instance: fmt.Sprintf("go-%d-%s", os.Getpid(), randomHex()),
		started:  time.Now(),
		rawMeta:  raw,
		meta:     m,
		model:    newModel(m, own, cfg.ignore, cfg.pathMap),
		baseline: map[funcKey][]uint32{},
	}
	if err := a.run(); err != nil {
		fmt.Fprintf(os.Stderr, "livecov: not started: %v\n", err)
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
