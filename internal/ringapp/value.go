package ringapp

import "fmt"

// golden is the increment of SplitMix64 (2^64 / φ).
const golden = 0x9e3779b97f4a7c15

// mix64 is the finalizer of SplitMix64: a bijection on 64-bit words that
// spreads every input bit over every output bit.
func mix64(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
	z = (z ^ (z >> 27)) * 0x94d049bb133111eb
	return z ^ (z >> 31)
}

// mix is what rank does to the value of message seq before it sends it on.
func mix(v uint64, rank int, seq uint64) uint64 {
	return mix64(v ^ mix64(uint64(rank)<<48^seq^0x5851f42d4c957f2d))
}

// initResult is rank 0's result before any message came back. It depends on
// every parameter, so runs that differ in any of them have different results
// even where the messages would not tell them apart (window >= messages).
func initResult(size, messages, window int, seed uint64) uint64 {
	r := mix64(seed ^ 0x2545f4914f6cdd1d)
	for _, p := range []int{size, messages, window} {
		r = mix64(r ^ uint64(p))
	}
	return r
}

// fold adds the value of message seq, back at rank 0, to the result. The
// order of the messages matters.
func fold(result, seq, v uint64) uint64 {
	return mix64(result+golden) ^ mix(v, -1, seq)
}

// formatResult is how results are printed, written and compared.
func formatResult(r uint64) string { return fmt.Sprintf("%016x", r) }

// burn is the deterministic busy loop of -compute: n rounds of mixing that
// depend on each other, about 4 ns each.
func burn(v uint64, n int) uint64 {
	for range n {
		v = mix64(v + golden)
	}
	return v
}

// Expected returns the result rank 0 of an uninterrupted run prints, computed
// without any network: size ranks, messages messages, window of them in
// flight, first values derived from seed. The payload size and -compute do
// not change the result.
func Expected(size, messages, window int, seed uint64) string {
	inflight := min(window, messages)
	pending := make([]uint64, inflight) // value rank 0 sends with message s, at s % inflight
	for s := range inflight {
		pending[s] = mix(seed, 0, uint64(s))
	}
	result := initResult(size, messages, window, seed)
	for j := range messages {
		seq := uint64(j)
		v := pending[j%inflight]
		for r := 1; r < size; r++ {
			v = mix(v, r, seq)
		}
		result = fold(result, seq, v)
		if next := j + window; next < messages {
			pending[j%inflight] = mix(v, 0, uint64(next))
		}
	}
	return formatResult(result)
}
