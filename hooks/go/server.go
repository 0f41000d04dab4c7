package livecov

// The HTTP/1.1 API (docs/protocol.md): GET /coverage, POST /reset, GET
// /health, on the Unix socket and on TCP (with the bearer token). Written
// over package net rather than net/http so that a build whose -coverpkg
// covers net/http reports the program's own HTTP traffic only, never the
// dumps'. The limits are the native agents'.

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"
)

const (
	maxConnections = 256
	maxHeadBytes   = 16 << 10
	maxHeaders     = 64
	maxBodyBytes   = 64 << 10
	headTimeout    = 10 * time.Second
	idleTimeout    = 30 * time.Second
	routes         = "GET /coverage, POST /reset, GET /health"
)

type request struct {
	method, path, query string
	headers             map[string]string // lower-case names; a repeated header keeps its last value
	close               bool
}

// errBare is a request the parser cannot read: a bare status, and the
// connection closed.
type errBare struct{ status int }

func (e errBare) Error() string { return strconv.Itoa(e.status) }

func (a *agent) serve(l net.Listener, tcp bool) {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			time.Sleep(10 * time.Millisecond) // out of descriptors, for instance
			continue
		}
		select {
		case a.limit <- struct{}{}:
			go func() {
				defer func() { <-a.limit }()
				a.handleConn(c, tcp)
			}()
		default:
			go func() {
				c.SetDeadline(time.Now().Add(headTimeout))
				a.respondError(c, 503, fmt.Sprintf("over %d connections at once", maxConnections), true)
				lingeringClose(c)
			}()
		}
	}
}

func (a *agent) handleConn(c net.Conn, tcp bool) {
	defer lingeringClose(c)
	// No request, however made, may take the program down.
	defer func() {
		if r := recover(); r != nil {
			say("internal error serving a request: %v", r)
		}
	}()
	// A buffer as large as a head may be: any line within the limit fits.
	br := bufio.NewReaderSize(c, maxHeadBytes)
	for {
		c.SetReadDeadline(time.Now().Add(idleTimeout))
		if _, err := br.Peek(1); err != nil {
			return
		}
		c.SetReadDeadline(time.Now().Add(headTimeout))
		req, err := readHead(br)
		if err != nil {
			var bare errBare
			if errors.As(err, &bare) {
				c.SetWriteDeadline(time.Now().Add(headTimeout))
				fmt.Fprintf(c, "HTTP/1.1 %d %s\r\ncontent-length: 0\r\nconnection: close\r\n\r\n", bare.status, statusText(bare.status))
			}
			return
		}
		c.SetReadDeadline(time.Time{})
		if !a.handle(c, br, req, tcp) || req.close {
			return
		}
	}
}

// lingeringClose ends a connection whose client may still be sending (a
// head over the limits, a body left unread): the answer is sent, then what
// arrives is read and dropped for a moment, so that closing does not reset
// the connection and lose the answer before the client reads it.
func lingeringClose(c net.Conn) {
	defer c.Close()
	if cw, ok := c.(interface{ CloseWrite() error }); ok {
		cw.CloseWrite()
	}
	c.SetReadDeadline(time.Now().Add(time.Second))
	io.Copy(io.Discard, io.LimitReader(c, 1<<20))
}

// readHead reads a request line and headers within the limits.
func readHead(br *bufio.Reader) (*request, error) {
	total := 0
	var lines []string
	for {
		line, err := br.ReadSlice('\n')
		total += len(line)
		if total > maxHeadBytes || errors.Is(err, bufio.ErrBufferFull) {
			return nil, errBare{431}
		}
		if err != nil {
			if len(lines) == 0 && len(line) == 0 {
				return nil, err
			}
			return nil, errBare{400}
		}
		text := strings.TrimRight(string(line), "\r\n")
		if text == "" {
			if len(lines) == 0 {
				continue // a blank line before a request is tolerated (RFC 9112, 2.2)
			}
			break
		}
		lines = append(lines, text)
		if len(lines) > maxHeaders+1 {
			return nil, errBare{431}
		}
	}
	parts := strings.Split(lines[0], " ")
	if len(parts) != 3 || parts[0] == "" || !strings.HasPrefix(parts[1], "/") || (parts[2] != "HTTP/1.1" && parts[2] != "HTTP/1.0") {
		return nil, errBare{400}
	}
	req := &request{method: parts[0], headers: map[string]string{}, close: parts[2] == "HTTP/1.0"}
	req.path, req.query, _ = strings.Cut(parts[1], "?")
	for _, h := range lines[1:] {
		name, value, ok := strings.Cut(h, ":")
		if !ok || name == "" || strings.ContainsAny(name, " \t") {
			return nil, errBare{400}
		}
		req.headers[strings.ToLower(name)] = strings.TrimSpace(value)
	}
	switch strings.ToLower(req.headers["connection"]) {
	case "close":
		req.close = true
	case "keep-alive":
		req.close = false
	}
	return req, nil
}

// handle answers one request; false when the connection must close.
func (a *agent) handle(c net.Conn, br *bufio.Reader, req *request, tcp bool) bool {
	// A body is read only where one means something (POST /reset); a
	// request with another cannot be followed by a next one.
	hasBody := req.headers["transfer-encoding"] != "" || (req.headers["content-length"] != "" && req.headers["content-length"] != "0")
	keep := !hasBody
	if tcp && a.cfg.token != "" {
		const prefix = "Bearer "
		got := req.headers["authorization"]
		if !strings.HasPrefix(got, prefix) || subtle.ConstantTimeCompare([]byte(got[len(prefix):]), []byte(a.cfg.token)) != 1 {
			a.respondError(c, 401, "missing or wrong bearer token (Authorization: Bearer <token>)", !keep, "www-authenticate: Bearer")
			return keep
		}
	}
	var allow string
	switch req.path {
	case "/coverage", "/health":
		allow = "GET"
	case "/reset":
		allow = "POST"
	default:
		a.respondError(c, 404, fmt.Sprintf("no route %s (routes: %s)", clip(req.path), routes), !keep)
		return keep
	}
	if req.method != allow {
		a.respondError(c, 405, fmt.Sprintf("method %s not allowed on %s (allowed: %s)", clip(req.method), req.path, allow), !keep, "allow: "+allow)
		return keep
	}
	switch req.path {
	case "/health":
		a.respond(c, 200, "application/json", a.metadata("running"), !keep)
	case "/reset":
		if status, err := readBody(c, br, req); err != nil {
			a.respondError(c, status, err.Error(), true)
			return false
		}
		if _, err := a.snapshot(true); err != nil {
			a.respondError(c, 500, err.Error(), false)
			return true
		}
		a.respond(c, 204, "", nil, false)
		return true
	case "/coverage":
		q, err := parseQuery(req.query)
		if err != nil {
			a.respondError(c, 400, err.Error(), !keep)
			return keep
		}
		var body []byte
		ctype := "text/plain; charset=utf-8"
		started := time.Now()
		switch q.format {
		case "lcov":
			body, err = a.lcovNow(q.test, q.reset)
		case "json":
			var counters map[funcKey][]uint32
			if counters, err = a.snapshot(q.reset); err == nil {
				body, ctype = a.model.summary(a.model.count(counters)), "application/json"
			}
		case "covdata":
			body, err = a.covdata(q.reset)
			ctype = "application/x-tar"
		}
		if err != nil {
			a.respondError(c, 500, err.Error(), !keep)
			return keep
		}
		// The time to make it, in milliseconds, as every agent says it.
		took := fmt.Sprintf("server-timing: report;dur=%.3f", float64(time.Since(started))/1e6)
		a.respond(c, 200, ctype, body, !keep, took)
	}
	return keep
}

// readBody reads and drops the body of POST /reset: at most 64 KiB, within 10 s.
func readBody(c net.Conn, br *bufio.Reader, req *request) (int, error) {
	c.SetReadDeadline(time.Now().Add(headTimeout))
	defer c.SetReadDeadline(time.Time{})
	var body io.Reader
	if te := strings.ToLower(req.headers["transfer-encoding"]); te != "" {
		if te != "chunked" {
			return 400, fmt.Errorf("transfer-encoding %q is not supported (chunked is)", clip(te))
		}
		body = &chunked{r: br}
	} else if cl := req.headers["content-length"]; cl != "" {
		n, err := strconv.ParseUint(cl, 10, 63)
		if err != nil {
			return 400, fmt.Errorf("content-length %q is not a number", clip(cl))
		}
		if n > maxBodyBytes {
			return 413, fmt.Errorf("request body over %d bytes", maxBodyBytes)
		}
		body = io.LimitReader(br, int64(n))
	} else {
		return 0, nil
	}
	n, err := io.Copy(io.Discard, io.LimitReader(body, maxBodyBytes+1))
	var timeout net.Error
	switch {
	case errors.As(err, &timeout) && timeout.Timeout():
		return 408, errors.New("request body not received in time")
	case err != nil:
		return 400, fmt.Errorf("could not read the request body: %v", err)
	case n > maxBodyBytes:
		return 413, fmt.Errorf("request body over %d bytes", maxBodyBytes)
	}
	if lr, ok := body.(*io.LimitedReader); ok && lr.N > 0 {
		return 400, errors.New("request body shorter than its content-length")
	}
	return 0, nil
}

// chunked reads a chunked body (RFC 9112, 7.1), trailers dropped.
type chunked struct {
	r    *bufio.Reader
	left int64
	done bool
}

func (c *chunked) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		line, err := c.r.ReadSlice('\n')
		if err != nil {
			return 0, err
		}
		size, _, _ := strings.Cut(strings.TrimSpace(string(line)), ";")
		n, err := strconv.ParseInt(size, 16, 64)
		if err != nil || n < 0 {
			return 0, fmt.Errorf("bad chunk size %q", clip(size))
		}
		if n == 0 {
			for { // trailers, up to the blank line
				line, err := c.r.ReadSlice('\n')
				if err != nil {
					return 0, err
				}
				if len(bytes.TrimSpace(line)) == 0 {
					c.done = true
					return 0, io.EOF
				}
			}
		}
		c.left = n
	}
	if int64(len(p)) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= int64(n)
	if c.left == 0 && err == nil {
		if _, err := c.r.Discard(2); err != nil {
			return n, err
		}
	}
	return n, err
}

type query struct {
	test   string
	reset  bool
	format string
}

// parseQuery reads /coverage's query as every agent does: an unknown,
// repeated or invalid parameter is an error.
func parseQuery(raw string) (query, error) {
	q := query{format: "lcov"}
	seen := map[string]bool{}
	for _, pair := range strings.Split(raw, "&") {
		if pair == "" {
			continue
		}
		k, v, _ := strings.Cut(pair, "=")
		key, err1 := url.QueryUnescape(k)
		value, err2 := url.QueryUnescape(v)
		if err1 != nil || err2 != nil {
			return q, errors.New("invalid percent-encoding in the query")
		}
		if !utf8.ValidString(key) || !utf8.ValidString(value) {
			return q, errors.New("the query is not UTF-8 once decoded")
		}
		if key != "test" && key != "reset" && key != "format" {
			return q, fmt.Errorf("unknown query parameter %s (valid: test, reset, format)", jsonClip(key))
		}
		if seen[key] {
			return q, fmt.Errorf("query parameter %s given more than once", key)
		}
		seen[key] = true
		switch key {
		case "test":
			for _, r := range value {
				if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
					return q, errors.New("test name must not contain control characters")
				}
			}
			q.test = value
		case "reset":
			switch value {
			case "1", "true":
				q.reset = true
			case "0", "false":
				q.reset = false
			default:
				return q, fmt.Errorf("invalid reset value %s (valid: 1, true, 0, false)", jsonClip(value))
			}
		case "format":
			switch value {
			case "lcov", "json", "covdata":
				q.format = value
			case "profraw", "counters", "mapping":
				return q, fmt.Errorf("format=%s is only served by LLVM-instrumented processes; this is a Go process (valid here: lcov, json, covdata)", value)
			default:
				return q, fmt.Errorf("invalid format %s (valid: lcov, json, covdata)", jsonClip(value))
			}
		}
	}
	return q, nil
}

func (a *agent) respond(c net.Conn, status int, ctype string, body []byte, close bool, extra ...string) {
	var h strings.Builder
	fmt.Fprintf(&h, "HTTP/1.1 %d %s\r\nlivecov-instance: %s\r\ncache-control: no-store\r\n", status, statusText(status), a.instance)
	if ctype != "" {
		fmt.Fprintf(&h, "content-type: %s\r\n", ctype)
	}
	if status != 204 {
		fmt.Fprintf(&h, "content-length: %d\r\n", len(body))
	}
	for _, e := range extra {
		h.WriteString(e + "\r\n")
	}
	if close {
		h.WriteString("connection: close\r\n")
	}
	h.WriteString("\r\n")
	c.SetWriteDeadline(time.Now().Add(idleTimeout))
	if _, err := io.WriteString(c, h.String()); err == nil && len(body) > 0 {
		c.Write(body)
	}
}

func (a *agent) respondError(c net.Conn, status int, message string, close bool, extra ...string) {
	a.respond(c, status, "application/json", []byte(`{"error":`+jsonString(message)+"}"), close, extra...)
}

func statusText(status int) string {
	switch status {
	case 200:
		return "OK"
	case 204:
		return "No Content"
	case 400:
		return "Bad Request"
	case 401:
		return "Unauthorized"
	case 404:
		return "Not Found"
	case 405:
		return "Method Not Allowed"
	case 408:
		return "Request Timeout"
	case 413:
		return "Payload Too Large"
	case 431:
		return "Request Header Fields Too Large"
	case 500:
		return "Internal Server Error"
	case 503:
		return "Service Unavailable"
	}
	return "Status"
}

// clip keeps the first 100 characters of what a client sent, for a message.
func clip(s string) string {
	n := 0
	for i := range s {
		if n == 100 {
			return s[:i]
		}
		n++
	}
	return s
}

func jsonClip(s string) string { return jsonString(clip(s)) }

// jsonString quotes s as a JSON string.
func jsonString(s string) string {
	var b strings.Builder
	b.WriteByte('"')
	for _, r := range s {
		switch {
		case r == '"' || r == '\\':
			b.WriteByte('\\')
			b.WriteRune(r)
		case r < 0x20:
			fmt.Fprintf(&b, `\u%04x`, r)
		default:
			b.WriteRune(r)
		}
	}
	b.WriteByte('"')
	return b.String()
}
