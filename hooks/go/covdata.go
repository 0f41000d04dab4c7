package livecov

// Go's coverage data formats, as runtime/coverage writes them and
// `go tool covdata` reads them (internal/coverage in Go's sources): the
// meta-data file (covmeta.<hash>: every covered package's functions and
// their blocks, fixed for a build) and the counter data file
// (covcounters.<hash>.<pid>.<time>: the counters of the functions that
// ran). The hook decodes both from its own process to compute LCOV, and
// encodes counter files again for `?format=covdata` after a reset.

import (
	"encoding/binary"
	"errors"
	"fmt"
)

var (
	metaMagic    = [4]byte{0x00, 0x63, 0x76, 0x6d}
	counterMagic = [4]byte{0x00, 0x63, 0x77, 0x6d}
)

const (
	metaFileHeaderSize    = 56 // magic, version, length, entries, hash, string table offset and length, mode, granularity, padding
	packageHeaderSize     = 44 // length, name, path, module path, hash, padding, files, functions
	counterFileHeaderSize = 32 // magic, version, meta hash, flavor, big endian, padding
	segmentHeaderSize     = 16 // functions, string table length, args length
	counterFooterSize     = 16 // magic, padding, segments, padding

	modeAtomic = 3

	flavorRaw  = 1
	flavorULEB = 2
)

var modeNames = map[byte]string{1: "set", 2: "count", 3: "atomic", 4: "regonly", 5: "testmain"}

// meta is a decoded meta-data file.
type meta struct {
	hash     [16]byte
	mode     byte
	packages []metaPackage
}

type metaPackage struct {
	path  string
	funcs []metaFunc
}

type metaFunc struct {
	name  string
	file  string
	units []unit
}

// unit is one coverable block: lines and columns of its start and end, and
// its number of statements.
type unit struct {
	startLine, startCol, endLine, endCol, statements uint32
}

// funcKey names a function in counter data: package and function index.
type funcKey struct{ pkg, fn uint32 }

// reader reads little-endian values and ULEB128 numbers from a byte slice;
// its first error sticks, later reads return zeros.
type reader struct {
	b   []byte
	off int
	err error
}

var errShort = errors.New("truncated")

func (r *reader) fail(err error) {
	if r.err == nil {
		r.err = err
	}
}

func (r *reader) bytes(n int) []byte {
	if r.err != nil || n < 0 || n > len(r.b)-r.off {
		r.fail(errShort)
		return nil
	}
	v := r.b[r.off : r.off+n]
	r.off += n
	return v
}

func (r *reader) u8() byte {
	if b := r.bytes(1); b != nil {
		return b[0]
	}
	return 0
}

func (r *reader) u32() uint32 {
	if b := r.bytes(4); b != nil {
		return binary.LittleEndian.Uint32(b)
	}
	return 0
}

func (r *reader) u64() uint64 {
	if b := r.bytes(8); b != nil {
		return binary.LittleEndian.Uint64(b)
	}
	return 0
}

func (r *reader) uleb() uint64 {
	var v uint64
	for shift := uint(0); ; shift += 7 {
		b := r.u8()
		if r.err != nil {
			return 0
		}
		if shift >= 64 {
			r.fail(errors.New("ULEB128 number too long"))
			return 0
		}
		v |= uint64(b&0x7f) << shift
		if b&0x80 == 0 {
			return v
		}
	}
}

// uleb32 is a ULEB128 number that must fit 32 bits.
func (r *reader) uleb32() uint32 {
	v := r.uleb()
	if v > 0xffffffff {
		r.fail(fmt.Errorf("number %d out of range", v))
		return 0
	}
	return uint32(v)
}

func (r *reader) seek(off uint64) {
	if off > uint64(len(r.b)) {
		r.fail(errShort)
		return
	}
	r.off = int(off)
}

// strings reads a string table: a count, then each string's length and bytes.
func (r *reader) strings() []string {
	n := r.uleb()
	if n > uint64(len(r.b)) {
		r.fail(errors.New("string table count larger than the data"))
		return nil
	}
	out := make([]string, 0, n)
	for i := uint64(0); i < n && r.err == nil; i++ {
		size := r.uleb()
		if size > uint64(len(r.b)) {
			r.fail(errShort)
			return nil
		}
		out = append(out, string(r.bytes(int(size))))
	}
	return out
}

func lookup(table []string, i uint32, r *reader) string {
	if int64(i) >= int64(len(table)) {
		r.fail(fmt.Errorf("string index %d out of range (%d strings)", i, len(table)))
		return ""
	}
	return table[i]
}

// decodeMeta decodes a meta-data file.
func decodeMeta(b []byte) (*meta, error) {
	r := &reader{b: b}
	if !hasMagic(r.bytes(4), metaMagic) {
		return nil, errors.New("not a Go coverage meta-data file (wrong magic)")
	}
	if v := r.u32(); v != 1 {
		return nil, fmt.Errorf("meta-data file version %d (this reader knows 1)", v)
	}
	total := r.u64()
	entries := r.u64()
	var m meta
	copy(m.hash[:], r.bytes(16))
	r.u32() // string table offset and length: the file-level table holds nothing the report needs
	r.u32()
	m.mode = r.u8()
	r.bytes(7)
	if r.err != nil {
		return nil, fmt.Errorf("meta-data header: %w", r.err)
	}
	if total > uint64(len(b)) || entries > total/16 {
		return nil, fmt.Errorf("meta-data header: %d packages in %d bytes (the file has %d)", entries, total, len(b))
	}
	offsets := make([]uint64, entries)
	for i := range offsets {
		offsets[i] = r.u64()
	}
	lengths := make([]uint64, entries)
	for i := range lengths {
		lengths[i] = r.u64()
	}
	if r.err != nil {
		return nil, fmt.Errorf("meta-data package table: %w", r.err)
	}
	for i := range offsets {
		if offsets[i] > uint64(len(b)) || lengths[i] > uint64(len(b))-offsets[i] {
			return nil, fmt.Errorf("package %d: %d bytes at %d, past the end of the file (%d bytes)", i, lengths[i], offsets[i], len(b))
		}
		p, err := decodePackage(b[offsets[i] : offsets[i]+lengths[i]])
		if err != nil {
			return nil, fmt.Errorf("package %d: %w", i, err)
		}
		m.packages = append(m.packages, p)
	}
	return &m, nil
}

func decodePackage(b []byte) (metaPackage, error) {
	r := &reader{b: b}
	r.u32() // length: the slice is the package
	r.u32() // name
	pathIndex := r.u32()
	r.u32() // module path
	r.bytes(16 + 4)
	r.u32() // files
	nfuncs := r.u32()
	if r.err != nil {
		return metaPackage{}, fmt.Errorf("header: %w", r.err)
	}
	if uint64(nfuncs)*4 > uint64(len(b)) {
		return metaPackage{}, fmt.Errorf("%d functions in %d bytes", nfuncs, len(b))
	}
	offsets := make([]uint32, nfuncs)
	for i := range offsets {
		offsets[i] = r.u32()
	}
	table := r.strings()
	p := metaPackage{path: lookup(table, pathIndex, r)}
	for i, off := range offsets {
		if r.err != nil {
			break
		}
		r.seek(uint64(off))
		n := r.uleb()
		name := lookup(table, r.uleb32(), r)
		file := lookup(table, r.uleb32(), r)
		if n > uint64(len(b)) {
			return metaPackage{}, fmt.Errorf("function %d: %d blocks in %d bytes", i, n, len(b))
		}
		f := metaFunc{name: name, file: file, units: make([]unit, 0, n)}
		for k := uint64(0); k < n && r.err == nil; k++ {
			f.units = append(f.units, unit{r.uleb32(), r.uleb32(), r.uleb32(), r.uleb32(), r.uleb32()})
		}
		r.uleb() // a function literal or not
		p.funcs = append(p.funcs, f)
	}
	if r.err != nil {
		return metaPackage{}, r.err
	}
	return p, nil
}

// counterData is a decoded counter data file: the counters of each
// function, the segments added up, and the file's first segment preamble
// (its string table and arguments, kept to encode the file again).
type counterData struct {
	metaHash [16]byte
	counters map[funcKey][]uint32
	preamble []byte
}

// decodeCounters decodes a counter data file.
func decodeCounters(b []byte) (*counterData, error) {
	r := &reader{b: b}
	if !hasMagic(r.bytes(4), counterMagic) {
		return nil, errors.New("not a Go coverage counter data file (wrong magic)")
	}
	if v := r.u32(); v != 1 {
		return nil, fmt.Errorf("counter data file version %d (this reader knows 1)", v)
	}
	c := &counterData{counters: map[funcKey][]uint32{}}
	copy(c.metaHash[:], r.bytes(16))
	flavor := r.u8()
	bigEndian := r.u8() != 0
	r.bytes(6)
	if r.err != nil {
		return nil, fmt.Errorf("counter data header: %w", r.err)
	}
	if flavor != flavorRaw && flavor != flavorULEB {
		return nil, fmt.Errorf("counter data flavor %d (known: 1 raw, 2 ULEB128)", flavor)
	}
	if len(b) < counterFileHeaderSize+counterFooterSize {
		return nil, errors.New("counter data file too short for its footer")
	}
	footer := &reader{b: b[len(b)-counterFooterSize:]}
	if !hasMagic(footer.bytes(4), counterMagic) {
		return nil, errors.New("counter data footer: wrong magic")
	}
	footer.u32()
	segments := footer.u32()
	if segments == 0 {
		return nil, errors.New("counter data file with no segments")
	}
	value := func() uint32 {
		if flavor == flavorULEB {
			return r.uleb32()
		}
		v := r.bytes(4)
		if v == nil {
			return 0
		}
		if bigEndian {
			return binary.BigEndian.Uint32(v)
		}
		return binary.LittleEndian.Uint32(v)
	}
	for s := uint32(0); s < segments; s++ {
		start := r.off
		funcs := r.u64()
		strLen := r.u32()
		argsLen := r.u32()
		r.bytes(int(strLen))
		r.bytes(int(argsLen))
		if pad := r.off % 4; pad != 0 {
			r.bytes(4 - pad)
		}
		if r.err != nil {
			return nil, fmt.Errorf("segment %d preamble: %w", s, r.err)
		}
		if s == 0 {
			c.preamble = b[start+segmentHeaderSize : r.off]
		}
		if funcs > uint64(len(b)) {
			return nil, fmt.Errorf("segment %d: %d functions in %d bytes", s, funcs, len(b))
		}
		for i := uint64(0); i < funcs; i++ {
			n := value()
			key := funcKey{value(), value()}
			if uint64(n) > uint64(len(b)) {
				r.fail(fmt.Errorf("function %d: %d counters in %d bytes", i, n, len(b)))
			}
			if r.err != nil {
				return nil, fmt.Errorf("segment %d: %w", s, r.err)
			}
			sum := c.counters[key]
			if sum == nil {
				sum = make([]uint32, n)
				c.counters[key] = sum
			} else if len(sum) != int(n) {
				return nil, fmt.Errorf("segment %d: package %d function %d has %d counters, %d before", s, key.pkg, key.fn, n, len(sum))
			}
			for k := range sum {
				sum[k] = saturatingAdd(sum[k], value())
			}
			if r.err != nil {
				return nil, fmt.Errorf("segment %d: %w", s, r.err)
			}
		}
		// Each segment is followed by a footer; the file's last one counts them.
		if f := r.bytes(counterFooterSize); f == nil || !hasMagic(f[:4], counterMagic) {
			return nil, fmt.Errorf("segment %d: no footer after its counters", s)
		}
	}
	if r.off != len(b) {
		return nil, fmt.Errorf("%d bytes after the last segment", len(b)-r.off)
	}
	return c, nil
}

// hasMagic says whether b, which may be short (a truncated file), is magic.
func hasMagic(b []byte, magic [4]byte) bool {
	return len(b) == 4 && [4]byte(b) == magic
}

func saturatingAdd(a, b uint32) uint32 {
	if s := a + b; s >= a {
		return s
	}
	return 0xffffffff
}

// encodeCounters writes a counter data file of one segment: `preamble`
// (string table and arguments, from a file the runtime wrote) and the
// counters of the functions of `counts` with any count, in key order.
func encodeCounters(metaHash [16]byte, preamble []byte, keys []funcKey, counts map[funcKey][]uint32) []byte {
	out := make([]byte, 0, 4096)
	out = append(out, counterMagic[:]...)
	out = binary.LittleEndian.AppendUint32(out, 1)
	out = append(out, metaHash[:]...)
	out = append(out, flavorULEB, 0, 0, 0, 0, 0, 0, 0)
	var body []byte
	live := uint64(0)
	for _, k := range keys {
		c := counts[k]
		if !anyNonZero(c) {
			continue
		}
		live++
		body = binary.AppendUvarint(body, uint64(len(c)))
		body = binary.AppendUvarint(body, uint64(k.pkg))
		body = binary.AppendUvarint(body, uint64(k.fn))
		for _, v := range c {
			body = binary.AppendUvarint(body, uint64(v))
		}
	}
	strLen, argsLen := splitPreamble(preamble)
	out = binary.LittleEndian.AppendUint64(out, live)
	out = binary.LittleEndian.AppendUint32(out, strLen)
	out = binary.LittleEndian.AppendUint32(out, argsLen)
	out = append(out, preamble...)
	out = append(out, body...)
	out = append(out, counterMagic[:]...)
	out = binary.LittleEndian.AppendUint32(out, 0)
	out = binary.LittleEndian.AppendUint32(out, 1)
	out = binary.LittleEndian.AppendUint32(out, 0)
	return out
}

// splitPreamble gives the lengths of a segment's string table and of its
// arguments (with their padding), as its header states them.
func splitPreamble(preamble []byte) (uint32, uint32) {
	r := &reader{b: preamble}
	r.strings()
	if r.err != nil {
		return uint32(len(preamble)), 0
	}
	return uint32(r.off), uint32(len(preamble) - r.off)
}

func anyNonZero(c []uint32) bool {
	for _, v := range c {
		if v != 0 {
			return true
		}
	}
	return false
}
