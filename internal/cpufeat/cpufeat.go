// Package cpufeat reads the CPU features a node offers to programs, and
// compares them: a process that started on a CPU with an extension (its
// libraries chose code paths for it, once, at start) dies with SIGILL
// where that extension is missing. The coordinator places a job's ranks,
// at restarts and migrations, only on nodes that have every feature of
// the nodes its ranks started on.
package cpufeat

import (
	"bufio"
	"bytes"
	"os"
	"slices"
	"strings"
)

// Read returns this machine's features, from /proc/cpuinfo.
func Read() ([]string, error) {
	b, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		return nil, err
	}
	return Parse(b), nil
}

// Parse returns, sorted, the features of the first processor in a
// /proc/cpuinfo that programs can use: on x86, the instruction set
// extensions of its "flags" line (not the kernel's own, such as
// mitigations or "hypervisor", which vary between hosts of one CPU
// model); on arm64, every hardware capability of its "Features" line.
func Parse(cpuinfo []byte) []string {
	sc := bufio.NewScanner(bytes.NewReader(cpuinfo))
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		key, val, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		var out []string
		switch strings.TrimSpace(key) {
		case "flags":
			for _, f := range strings.Fields(val) {
				if isaFlag(f) {
					out = append(out, f)
				}
			}
		case "Features":
			out = strings.Fields(val)
		default:
			continue
		}
		slices.Sort(out)
		return slices.Compact(out)
	}
	return nil
}

// isaFlags are the x86 flags (Linux's names) for instruction set
// extensions that compilers and libraries pick code paths by.
var isaFlags = map[string]bool{
	"mmx": true, "sse": true, "sse2": true, "pni": true, "ssse3": true, "sse4_1": true, "sse4_2": true, "sse4a": true,
	"popcnt": true, "abm": true, "avx": true, "avx2": true, "f16c": true, "fma": true, "fma4": true, "xop": true,
	"bmi1": true, "bmi2": true, "adx": true, "aes": true, "pclmulqdq": true, "sha_ni": true, "movbe": true,
	"rdrand": true, "rdseed": true, "cx16": true, "lahf_lm": true, "xsave": true, "xsavec": true, "xsaveopt": true,
	"clflushopt": true, "clwb": true, "vaes": true, "vpclmulqdq": true, "gfni": true, "avx_vnni": true,
	"erms": true, "fsrm": true, "rtm": true, "hle": true, "movdiri": true, "movdir64b": true, "serialize": true,
}

func isaFlag(f string) bool {
	return isaFlags[f] || strings.HasPrefix(f, "avx512") || strings.HasPrefix(f, "amx_")
}

// Missing returns, sorted, the features of need that have lacks.
func Missing(need, have []string) []string {
	var out []string
	for _, f := range need {
		if !slices.Contains(have, f) {
			out = append(out, f)
		}
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Union returns every feature of the sets, sorted.
func Union(sets ...[]string) []string {
	var out []string
	for _, s := range sets {
		out = append(out, s...)
	}
	slices.Sort(out)
	return slices.Compact(out)
}
