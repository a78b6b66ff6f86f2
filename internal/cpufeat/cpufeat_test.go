package cpufeat_test

import (
	"slices"
	"testing"

	"github.com/cairn-hpc/cairn/internal/cpufeat"
)

const x86 = `processor	: 0
vendor_id	: GenuineIntel
flags		: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr pge mca cmov pat pse36 clflush mmx fxsr sse sse2 ss ht syscall nx pdpe1gb rdtscp lm constant_tsc rep_good nopl xtopology nonstop_tsc cpuid tsc_known_freq pni pclmulqdq ssse3 fma cx16 pcid sse4_1 sse4_2 x2apic movbe popcnt aes xsave avx f16c rdrand hypervisor lahf_lm abm 3dnowprefetch invpcid_single ssbd ibrs ibpb stibp fsgsbase bmi1 avx2 smep bmi2 erms invpcid avx512f avx512dq rdseed adx smap clflushopt clwb avx512cd avx512bw avx512vl xsaveopt xsavec xgetbv1 xsaves arat md_clear flush_l1d arch_capabilities
bugs		: spectre_v1

processor	: 1
flags		: fpu sse sse2
`

const arm = `processor	: 0
BogoMIPS	: 50.00
Features	: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid
CPU implementer	: 0x41
`

func TestParse(t *testing.T) {
	got := cpufeat.Parse([]byte(x86))
	for _, f := range []string{"sse2", "avx2", "avx512f", "fma", "bmi2", "aes", "pni"} {
		if !slices.Contains(got, f) {
			t.Errorf("x86: no %s in %v", f, got)
		}
	}
	for _, f := range []string{"hypervisor", "md_clear", "ibrs", "constant_tsc", "fpu"} {
		if slices.Contains(got, f) {
			t.Errorf("x86: %s is the kernel's, not a program's, but is in %v", f, got)
		}
	}
	if !slices.IsSorted(got) {
		t.Errorf("not sorted: %v", got)
	}
	if got := cpufeat.Parse([]byte(arm)); !slices.Equal(got, []string{"aes", "asimd", "asimdhp", "atomics", "cpuid", "crc32", "evtstrm", "fp", "fphp", "pmull", "sha1", "sha2"}) {
		t.Errorf("arm64: %v", got)
	}
	if got := cpufeat.Parse([]byte("garbage\n")); got != nil {
		t.Errorf("no flags line: %v", got)
	}
}

func TestMissingUnion(t *testing.T) {
	need := cpufeat.Union([]string{"sse2", "avx2"}, []string{"avx512f", "sse2"})
	if !slices.Equal(need, []string{"avx2", "avx512f", "sse2"}) {
		t.Fatalf("Union: %v", need)
	}
	if got := cpufeat.Missing(need, []string{"sse2", "avx2"}); !slices.Equal(got, []string{"avx512f"}) {
		t.Errorf("Missing: %v", got)
	}
	if got := cpufeat.Missing(need, need); got != nil {
		t.Errorf("Missing of a superset: %v", got)
	}
}

// TestRead: this machine's own, as an agent reports them at join.
func TestRead(t *testing.T) {
	got, err := cpufeat.Read()
	if err != nil {
		t.Fatal(err)
	}
	if len(got) == 0 {
		t.Fatal("no features read from /proc/cpuinfo")
	}
	t.Logf("%v", got)
}
