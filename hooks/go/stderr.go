package livecov

import (
	"fmt"
	"syscall"
)

// say writes one line, "livecov: " and the message, to the program's
// standard error. Not through os.Stderr: a write of os.Stderr to a pipe
// whose reader is gone ends the program with SIGPIPE (Go's rule for
// descriptors 1 and 2), so a program that never writes to its stderr would
// die of the hook's line. A write that fails loses the line and nothing
// else.
func say(format string, args ...any) {
	line := []byte("livecov: " + fmt.Sprintf(format, args...) + "\n")
	for len(line) > 0 {
		n, err := syscall.Write(2, line)
		if err == syscall.EINTR {
			continue
		}
		if err != nil || n <= 0 {
			return
		}
		line = line[n:]
	}
}
