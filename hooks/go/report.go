package livecov

// LCOV from Go coverage (docs/formats.md, "Go"): one record per source
// file as the meta-data names it (`go tool cover`'s names), DA for every
// line of every block from its start line to its end line with the largest
// count of the blocks on it, FN/FNDA per function.

import (
	"fmt"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// model is what a build's meta-data says about its source files, laid out
// so that a report is one pass over the counters.
type model struct {
	files []*fileModel // sorted by reported path
	// blocks of each function with meta-data, by counter key.
	funcs map[funcKey]*funcModel
	// keys in meta-data order, for encoding counter files.
	keys []funcKey
}

type fileModel struct {
	index int      // in model.files
	path  string   // as reported: LIVECOV_PATH_MAP applied
	lines []uint32 // every line of a block, ascending
	funcs []*funcModel
}

type funcModel struct {
	index  int    // in fileCounts.funcs
	name   string // unique in its file
	line   uint32
	file   *fileModel
	blocks []blockLines
	entry  int  // the block that starts first: its count is the function's
	hidden bool // in an ignored file or the hook's own package: counted nowhere
}

// blockLines are the lines of a block: indexes first..first+count-1 of its file's lines.
type blockLines struct{ first, count int }

type pathRewrite struct{ from, to string }

func rewritePath(path string, rewrites []pathRewrite) string {
	for _, r := range rewrites {
		if strings.HasPrefix(path, r.from) {
			return r.to + path[len(r.from):]
		}
	}
	return path
}

// newModel lays out `m`, leaving out the packages of `ownPackage` and the
// files `ignore` matches.
func newModel(m *meta, ownPackage string, ignore *regexp.Regexp, rewrites []pathRewrite) *model {
	type rawFunc struct {
		key  funcKey
		meta *metaFunc
	}
	byFile := map[string][]rawFunc{}
	md := &model{funcs: map[funcKey]*funcModel{}}
	for pi := range m.packages {
		p := &m.packages[pi]
		own := p.path == ownPackage || strings.HasPrefix(p.path, ownPackage+"/")
		for fi := range p.funcs {
			f := &p.funcs[fi]
			key := funcKey{uint32(pi), uint32(fi)}
			md.keys = append(md.keys, key)
			if own || (ignore != nil && ignore.MatchString(f.file)) || len(f.units) == 0 {
				md.funcs[key] = &funcModel{hidden: true}
				continue
			}
			byFile[f.file] = append(byFile[f.file], rawFunc{key, f})
		}
	}
	for source, funcs := range byFile {
		fm := &fileModel{path: rewritePath(source, rewrites)}
		seen := map[uint32]bool{}
		for _, f := range funcs {
			for _, u := range f.meta.units {
				for l := u.startLine; l <= lastLine(u); l++ {
					if !seen[l] {
						seen[l] = true
						fm.lines = append(fm.lines, l)
					}
				}
			}
		}
		sort.Slice(fm.lines, func(i, j int) bool { return fm.lines[i] < fm.lines[j] })
		index := make(map[uint32]int, len(fm.lines))
		for i, l := range fm.lines {
			index[l] = i
		}
		for _, f := range funcs {
			fn := &funcModel{name: f.meta.name, line: f.meta.units[0].startLine, file: fm}
			for i, u := range f.meta.units {
				if first := f.meta.units[fn.entry]; u.startLine < first.startLine || (u.startLine == first.startLine && u.startCol < first.startCol) {
					fn.entry = i
				}
				fn.line = min(fn.line, u.startLine)
				fn.blocks = append(fn.blocks, blockLines{index[u.startLine], int(lastLine(u)-u.startLine) + 1})
			}
			fn.index = len(md.funcs)
			md.funcs[f.key] = fn
			fm.funcs = append(fm.funcs, fn)
		}
		sort.SliceStable(fm.funcs, func(i, j int) bool {
			a, b := fm.funcs[i], fm.funcs[j]
			return a.line < b.line || (a.line == b.line && a.name < b.name)
		})
		uniqueNames(fm.funcs)
		md.files = append(md.files, fm)
	}
	sort.Slice(md.files, func(i, j int) bool { return md.files[i].path < md.files[j].path })
	for i, f := range md.files {
		f.index = i
	}
	return md
}

// lastLine is a block's end line (its start line if the end came first).
func lastLine(u unit) uint32 {
	return max(u.endLine, u.startLine)
}

// uniqueNames makes the names of a file's functions unique, as LCOV needs
// them to be: a file can hold several `init` functions, and the literals
// of a function are named after it.
func uniqueNames(funcs []*funcModel) {
	count := map[string]int{}
	for _, f := range funcs {
		count[f.name]++
	}
	used := map[string]bool{}
	for _, f := range funcs {
		name := f.name
		if count[name] > 1 {
			name = fmt.Sprintf("%s (line %d)", name, f.line)
		}
		unique := name
		for n := 2; used[unique]; n++ {
			unique = fmt.Sprintf("%s #%d", name, n)
		}
		used[unique] = true
		f.name = unique
	}
}

// fileCounts are the counts of one report: per file, a count per line of
// its `lines`, and per function (by index) its count.
type fileCounts struct {
	lines [][]uint64
	funcs []uint64
}

// count applies the counters of a snapshot to the model.
func (md *model) count(counters map[funcKey][]uint32) fileCounts {
	fc := fileCounts{lines: make([][]uint64, len(md.files)), funcs: make([]uint64, len(md.funcs))}
	for i, f := range md.files {
		fc.lines[i] = make([]uint64, len(f.lines))
	}
	for key, values := range counters {
		fn := md.funcs[key]
		if fn == nil || fn.hidden {
			continue
		}
		lines := fc.lines[fn.file.index]
		if fn.entry < len(values) {
			fc.funcs[fn.index] = uint64(values[fn.entry])
		}
		for i, b := range fn.blocks {
			if i >= len(values) {
				break
			}
			v := uint64(values[i])
			for l := b.first; l < b.first+b.count; l++ {
				lines[l] = max(lines[l], v)
			}
		}
	}
	return fc
}

// lcov writes the report, with `TN:test` before each record when test is not empty.
// Appends rather than fmt: with -coverpkg=all every call into the standard
// library counts, and fmt would make a large report's dump several times slower.
func (md *model) lcov(fc fileCounts, test string) []byte {
	var b []byte
	num := func(prefix string, v uint64) {
		b = append(b, prefix...)
		b = strconv.AppendUint(b, v, 10)
	}
	for i, f := range md.files {
		if test != "" {
			b = append(b, "TN:"+test+"\n"...)
		}
		b = append(b, "SF:"+f.path+"\n"...)
		for _, fn := range f.funcs {
			num("FN:", uint64(fn.line))
			b = append(b, ","+fn.name+"\n"...)
		}
		hit := 0
		for _, fn := range f.funcs {
			c := fc.funcs[fn.index]
			if c > 0 {
				hit++
			}
			num("FNDA:", c)
			b = append(b, ","+fn.name+"\n"...)
		}
		num("FNF:", uint64(len(f.funcs)))
		num("\nFNH:", uint64(hit))
		b = append(b, '\n')
		linesHit := 0
		for j, l := range f.lines {
			c := fc.lines[i][j]
			if c > 0 {
				linesHit++
			}
			num("DA:", uint64(l))
			num(",", c)
			b = append(b, '\n')
		}
		num("BRF:0\nBRH:0\nLF:", uint64(len(f.lines)))
		num("\nLH:", uint64(linesHit))
		b = append(b, "\nend_of_record\n"...)
	}
	return b
}

// summary is `?format=json`: per-file and total line and function counts
// (Go coverage has no branches).
func (md *model) summary(fc fileCounts) []byte {
	var b strings.Builder
	b.WriteString(`{"files":[`)
	var lines, linesHit, funcs, funcsHit int
	for i, f := range md.files {
		lh, fh := 0, 0
		for _, c := range fc.lines[i] {
			if c > 0 {
				lh++
			}
		}
		for _, fn := range f.funcs {
			if fc.funcs[fn.index] > 0 {
				fh++
			}
		}
		if i > 0 {
			b.WriteString(",")
		}
		fmt.Fprintf(&b, `{"branches":0,"branches_hit":0,"file":%s,"functions":%d,"functions_hit":%d,"lines":%d,"lines_hit":%d}`,
			jsonString(f.path), len(f.funcs), fh, len(f.lines), lh)
		lines += len(f.lines)
		linesHit += lh
		funcs += len(f.funcs)
		funcsHit += fh
	}
	fmt.Fprintf(&b, `],"totals":{"branches":0,"branches_hit":0,"functions":%d,"functions_hit":%d,"lines":%d,"lines_hit":%d}}`,
		funcs, funcsHit, lines, linesHit)
	return []byte(b.String())
}
