package chunker

// gearSeed seeds the generator of the gear table: the ASCII bytes "cairncdc".
const gearSeed = 0x636169726e636463

// gear maps each byte value to a pseudo-random 64-bit number. The table is
// part of the on-disk format: entry i is the (i+1)-th output of SplitMix64
// seeded with gearSeed (docs/format.md). It is not keyed per store: every
// store cuts the same content at the same places, which lets stores on
// different nodes share chunks.
var gear = func() (t [256]uint64) {
	s := uint64(gearSeed)
	for i := range t {
		s += 0x9e3779b97f4a7c15
		z := s
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9
		z = (z ^ (z >> 27)) * 0x94d049bb133111eb
		t[i] = z ^ (z >> 31)
	}
	return t
}()
