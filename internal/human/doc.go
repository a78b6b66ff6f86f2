// Package human writes quantities for people, the way cairn's CLI and
// demos print them: sizes in binary units (1.5 MiB), durations rounded to
// what a reader can use, times as how long ago they were; and reads sizes
// as people write them (ParseBytes: 512M, 1G) and draws progress bars
// (Bar).
package human
