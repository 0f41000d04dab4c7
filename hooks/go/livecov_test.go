package livecov

// The parts of the hook that need no coverage build: the environment, the
// query, the counter file encoder against the decoder, JSON quoting, the
// pending signals read from a process's status. The
// rest is tested end to end (tests/tests/hooks_go.rs) with real builds.

import (
	"reflect"
	"strings"
	"syscall"
	"testing"
)

func env(vars map[string]string) func(string) string {
	return func(name string) string { return vars[name] }
}

func TestConfig(t *testing.T) {
	if cfg, err := readConfig(env(nil)); cfg != nil || err != nil {
		t.Fatalf("no variables: %v, %v", cfg, err)
	}
	cfg, err := readConfig(env(map[string]string{
		"LIVECOV_DIR": "cov", "LIVECOV_FLUSH_SECS": "0.5", "LIVECOV_PATH_MAP": "a/=,b=c", "LIVECOV_SOCKET_MODE": "0660",
	}))
	if err != nil {
		t.Fatal(err)
	}
	if !strings.HasSuffix(cfg.dir, "/cov") || cfg.flush.Seconds() != 0.5 || cfg.socketMode != 0o660 ||
		!reflect.DeepEqual(cfg.pathMap, []pathRewrite{{"a/", ""}, {"b", "c"}}) {
		t.Fatalf("%+v", cfg)
	}
	for vars, want := range map[string]string{
		"LIVECOV_FLUSH_SECS=soon":         `LIVECOV_FLUSH_SECS="soon" is not a positive number of seconds`,
		"LIVECOV_LISTEN=localhost:1":      "is not an IP address and a port",
		"LIVECOV_IGNORE=(":                "is not a regular expression",
		"LIVECOV_PATH_MAP=x":              `"x" is not from=to`,
		"LIVECOV_SOCKET_MODE=9":           "is not an octal file mode",
		"LIVECOV_TOKEN_FILE=/nonexistent": "cannot be read",
	} {
		name, value, _ := strings.Cut(vars, "=")
		_, err := readConfig(env(map[string]string{"LIVECOV_DIR": "cov", name: value}))
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%s: %v, want %q", vars, err, want)
		}
	}
	// An address other than loopback without a token: only the socket serves.
	cfg, err = readConfig(env(map[string]string{"LIVECOV_DIR": "cov", "LIVECOV_LISTEN": "0.0.0.0:9464"}))
	if err != nil || cfg.listen != "" {
		t.Fatalf("%+v, %v", cfg, err)
	}
	if _, err := readConfig(env(map[string]string{"LIVECOV_LISTEN": "0.0.0.0:9464"})); err == nil {
		t.Fatal("no LIVECOV_DIR, no token, not loopback: refused")
	}
}

func TestPendingSignals(t *testing.T) {
	status := "SigQ:\t1/95412\nSigPnd:\t0000000000000002\nShdPnd:\t0000000000004000\nSigBlk:\t0000000000000000\n"
	for sig, want := range map[syscall.Signal]bool{syscall.SIGTERM: true, syscall.SIGINT: false, syscall.SIGHUP: false} {
		if got := pendingIn(status, sig); got != want {
			t.Errorf("%v pending: %v, want %v", sig, got, want)
		}
	}
	if pendingIn("Name:\tx\n", syscall.SIGTERM) || pendingIn("ShdPnd:\tzz\n", syscall.SIGTERM) {
		t.Error("no ShdPnd line, or a malformed one: not pending")
	}
	if pending(syscall.SIGTERM) {
		t.Error("SIGTERM pending in this process")
	}
}

func TestQuery(t *testing.T) {
	q, err := parseQuery("test=login+page%21&reset=true&format=covdata")
	if err != nil || q != (query{test: "login page!", reset: true, format: "covdata"}) {
		t.Fatalf("%+v, %v", q, err)
	}
	for raw, want := range map[string]string{
		"format=xml":                        `invalid format "xml" (valid: lcov, json, covdata)`,
		"format=profraw":                    "only served by LLVM-instrumented processes",
		"colour=red":                        `unknown query parameter "colour"`,
		"reset=1&reset=0":                   "given more than once",
		"reset=maybe":                       `invalid reset value "maybe"`,
		"test=%0A":                          "control characters",
		"test=%FF":                          "not UTF-8",
		"test=%zz":                          "invalid percent-encoding",
		"reset=" + strings.Repeat("é", 200): `value "` + strings.Repeat("é", 100) + `" (valid`,
	} {
		if _, err := parseQuery(raw); err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("%.40s: %v, want %q", raw, err, want)
		}
	}
}

func TestCountersRoundTrip(t *testing.T) {
	counts := map[funcKey][]uint32{{0, 1}: {3, 0, 70000}, {2, 0}: {0}, {1, 4}: {1}}
	keys := []funcKey{{0, 1}, {1, 4}, {2, 0}}
	// A preamble as the runtime writes it: a string table of "" and "argc",
	// "1", one argument pair, padded to four bytes from offset 48.
	preamble := []byte{3, 0, 4, 'a', 'r', 'g', 'c', 1, '1', 1, 1, 2, 0, 0, 0, 0}
	file := encodeCounters([16]byte{9}, preamble, keys, counts)
	cd, err := decodeCounters(file)
	if err != nil {
		t.Fatal(err)
	}
	delete(counts, funcKey{2, 0}) // nothing counted: not written
	if cd.metaHash != ([16]byte{9}) || !reflect.DeepEqual(cd.counters, counts) || string(cd.preamble) != string(preamble) {
		t.Fatalf("%+v", cd)
	}
	for _, cut := range []int{0, 10, 40, len(file) - 1} {
		if _, err := decodeCounters(file[:cut]); err == nil {
			t.Errorf("truncated at %d: decoded", cut)
		}
	}
}

func TestJSONString(t *testing.T) {
	if got := jsonString("a\"b\\c\n\u0001é"); got != `"a\"b\\c\u000a\u0001é"` {
		t.Fatal(got)
	}
}
