package livecov

// The LIVECOV_* environment (docs/environment.md), read as every livecov
// agent reads it: an empty value is an unset one, a value the hook cannot
// use stops it with one line on stderr.

import (
	"fmt"
	"net"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

type config struct {
	dir                string // absolute; "" without LIVECOV_DIR
	listen             string
	token              string
	ignore             *regexp.Regexp
	flush              time.Duration
	pathMap            []pathRewrite
	socketMode         os.FileMode
	listenWithoutToken bool
}

// readConfig reads the environment through variable; nil when neither
// LIVECOV_DIR nor LIVECOV_LISTEN is set.
func readConfig(variable func(string) string) (*config, error) {
	cfg := &config{dir: variable("LIVECOV_DIR"), listen: variable("LIVECOV_LISTEN"), socketMode: 0o600}
	if cfg.dir == "" && cfg.listen == "" {
		return nil, nil
	}
	if cfg.dir != "" {
		abs, err := filepath.Abs(cfg.dir)
		if err != nil {
			return nil, fmt.Errorf("LIVECOV_DIR=%q: %v", cfg.dir, err)
		}
		cfg.dir = abs
	}
	cfg.token = variable("LIVECOV_TOKEN")
	if file := variable("LIVECOV_TOKEN_FILE"); cfg.token == "" && file != "" {
		b, err := os.ReadFile(file)
		if err != nil {
			return nil, fmt.Errorf("LIVECOV_TOKEN_FILE=%q cannot be read: %v", file, err)
		}
		cfg.token = strings.TrimSpace(string(b))
		if cfg.token == "" {
			return nil, fmt.Errorf("LIVECOV_TOKEN_FILE=%q is empty", file)
		}
	}
	cfg.listenWithoutToken = variable("LIVECOV_LISTEN_WITHOUT_TOKEN") == "1"
	if cfg.listen != "" {
		host, port, err := net.SplitHostPort(cfg.listen)
		ip := net.ParseIP(host)
		if _, perr := strconv.ParseUint(port, 10, 16); err != nil || ip == nil || perr != nil {
			return nil, fmt.Errorf("LIVECOV_LISTEN=%q is not an IP address and a port (e.g. 127.0.0.1:9464)", cfg.listen)
		}
		if !ip.IsLoopback() && cfg.token == "" && !cfg.listenWithoutToken {
			msg := fmt.Sprintf("LIVECOV_LISTEN=%q is not a loopback address and no LIVECOV_TOKEN is set (set one, or LIVECOV_LISTEN_WITHOUT_TOKEN=1)", cfg.listen)
			if cfg.dir == "" {
				return nil, fmt.Errorf("%s", msg)
			}
			say("not listening on TCP: %s; the socket in LIVECOV_DIR serves", msg)
			cfg.listen = ""
		}
	}
	if re := variable("LIVECOV_IGNORE"); re != "" {
		compiled, err := regexp.Compile(re)
		if err != nil {
			return nil, fmt.Errorf("LIVECOV_IGNORE=%q is not a regular expression: %v", re, err)
		}
		cfg.ignore = compiled
	}
	if s := variable("LIVECOV_FLUSH_SECS"); s != "" {
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || !(secs > 0) || secs > 1e9 {
			return nil, fmt.Errorf("LIVECOV_FLUSH_SECS=%q is not a positive number of seconds", s)
		}
		cfg.flush = time.Duration(secs * float64(time.Second))
	}
	if s := variable("LIVECOV_PATH_MAP"); s != "" {
		for _, pair := range strings.Split(s, ",") {
			from, to, ok := strings.Cut(pair, "=")
			if !ok || from == "" {
				return nil, fmt.Errorf("LIVECOV_PATH_MAP=%q: %q is not from=to", s, pair)
			}
			cfg.pathMap = append(cfg.pathMap, pathRewrite{from, to})
		}
	}
	if s := variable("LIVECOV_SOCKET_MODE"); s != "" {
		mode, err := strconv.ParseUint(s, 8, 32)
		if err != nil || mode > 0o777 {
			return nil, fmt.Errorf("LIVECOV_SOCKET_MODE=%q is not an octal file mode (e.g. 0660)", s)
		}
		cfg.socketMode = os.FileMode(mode)
	}
	return cfg, nil
}
