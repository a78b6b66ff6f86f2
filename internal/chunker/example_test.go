package chunker_test

import (
	"bytes"
	"fmt"
	"io"

	"github.com/cairn-hpc/cairn/internal/chunker"
)

func Example() {
	data := randData(1, 4<<20)
	c := chunker.New(bytes.NewReader(data), chunker.DefaultParams)
	buf := make([]byte, chunker.MaxSize)
	var n int
	for {
		ch, err := c.Next(buf)
		if err == io.EOF {
			break
		}
		if err != nil {
			panic(err)
		}
		n++
		_ = ch.Data // hash and store the chunk here
	}
	fmt.Println(n, "chunks")
	// Output: 14 chunks
}

func ExampleFixed() {
	// A CRIU page image is a sequence of 4 KiB pages.
	pages := make([]byte, 10*chunker.PageSize)
	c := chunker.New(bytes.NewReader(pages), chunker.Fixed(4*chunker.PageSize))
	for {
		ch, err := c.Next(nil)
		if err == io.EOF {
			break
		}
		fmt.Println(ch.Start, ch.Length)
	}
	// Output:
	// 0 16384
	// 16384 16384
	// 32768 8192
}
