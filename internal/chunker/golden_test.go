package chunker_test

import (
	"bytes"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/zeebo/blake3"

	"github.com/cairn-hpc/cairn/internal/chunker"
)

var printGolden = flag.Bool("print-golden", false, "print the golden chunk table instead of checking it")

type golden struct {
	Start  uint64
	Length int
	ID     string // BLAKE3-256 of the chunk, hex
}

var smallParams = chunker.Params{Min: 2 << 10, Avg: 8 << 10, Max: 32 << 10}

// goldenCases pins chunk boundaries and ids. If a change to the chunker
// makes this test fail, the change alters the on-disk format: every stored
// image would stop deduplicating against new ones.
var goldenCases = []struct {
	name   string
	params chunker.Params
	data   func() []byte
	want   []golden
}{
	{"default/empty", chunker.DefaultParams, func() []byte { return nil }, nil},
	{"default/short", chunker.DefaultParams, func() []byte { return randData(7, 1000) }, []golden{
		{0, 1000, "1e809785cac42a4b58e6765eabc39514f8ecb90cc003c6bc61b6755ed92f5337"},
	}},
	{"default/random-4MiB", chunker.DefaultParams, func() []byte { return randData(1, 4<<20) }, []golden{
		{0, 281050, "6668c2d5c046832ef6135ed75f656f63e8b44de9e0001ca23433baf62773982c"},
		{281050, 444134, "9391d47c7800ef3303df2515678f842ae2c145cfcfe82a808fdefa9c5db5d31d"},
		{725184, 336703, "543e4975f38ea0bd4030bc4a9b799d3699cb2e335e99c2d1025f6b875fee3740"},
		{1061887, 274553, "c2e4c461d1c2d5057829c40f0b4afe36e41cc37ae3a61af2d5301afab4651def"},
		{1336440, 391124, "2fa03795cfd54379ab2b166165ec29407b5347a1d9a530e4b876726b2e8b7b32"},
		{1727564, 357996, "a8f88741a9c2d2b9890c8d38aa926ae5f95d0cfe6b7bff3dc12c62fd1f3a2a66"},
		{2085560, 380236, "f6bf7ff53f5fbfd0d66e5ca44623adfd92a790b32cc27047fdd4d37f1ae9ddeb"},
		{2465796, 151189, "a3b4f7e836748febb9002a69d92f6282e13e9e22b6a526dd6487f237baec45fe"},
		{2616985, 314727, "b53e3b5853fc15388ccd70af328a745e05a7b9cc3603fb7e7e544e8e9fd5ca8d"},
		{2931712, 328318, "32ce11c3bcb985baef85c4dee76a43ce3a68d05c1ffbd4121728752e1c298858"},
		{3260030, 327325, "c45b10e434230ac3a88e0f6a48a2ff8432066ce2b4c0a78cb95f0485500008d3"},
		{3587355, 343371, "5a395d89806b7559e204f8edac9885503fc50c716418e62f0cb2853dbfb94bf0"},
		{3930726, 66867, "dac58b29dcba18b49623ae6162b8592b1f96f0640d7ebe5e536344f83cf8c5d6"},
		{3997593, 196711, "ebed36f5eecad2d2f7d070b5acd83e8598fad65df48b170750a38a35af1e170e"},
	}},
	{"default/zeros-3MiB+1", chunker.DefaultParams, func() []byte { return make([]byte, 3<<20+1) }, []golden{
		{0, 1048576, "488de202f73bd976de4e7048f4e1f39a776d86d582b7348ff53bf432b987fca8"},
		{1048576, 1048576, "488de202f73bd976de4e7048f4e1f39a776d86d582b7348ff53bf432b987fca8"},
		{2097152, 1048576, "488de202f73bd976de4e7048f4e1f39a776d86d582b7348ff53bf432b987fca8"},
		{3145728, 1, "2d3adedff11b61f14c886e35afa036736dcd87a74d27b5c1510225d0f592e213"},
	}},
	{"small/random-256KiB", smallParams, func() []byte { return randData(2, 256<<10) }, []golden{
		{0, 8863, "90342a0059a007903de4a492cd1d7b26b50440d16f876284510baee673bf0efa"},
		{8863, 6465, "520bece44681964b7282789cc510596037ff0823a4df401886f6362fa1264299"},
		{15328, 13068, "c1122831d52777b95673b0227defc07bd5734b36794fa860828053172dfc6d96"},
		{28396, 8656, "19ed1ec068f30f9067b8d0f07bbae7b05014545706a5c59238bb00fcf4efe75c"},
		{37052, 9665, "436db5820c9a1a2cac9a78c2b2abc253a451f5e02851573c04342725ccc50294"},
		{46717, 10933, "f956067dd8c9f1fac7da5d9af5c6554a3025393f29026357b55183bb96d3fe48"},
		{57650, 9745, "ddf02fa650f00e81805d82752a243bd85ac9b552e0a826ee3599828351de6853"},
		{67395, 11199, "5113b28352bac32b3f0610a31c7562894a7bb0ee577dd824ba1c6699b3eab04b"},
		{78594, 8295, "f62813aaed5a601e0685a2c90d10238c61a471e86eeb70524c5863b30e2c755f"},
		{86889, 9183, "ea3967872b8c8123fae0b1842a99975acaa84f283d2734df0b3398184b25ac7f"},
		{96072, 5546, "146363d0265061a96ce2a6b8bc27df745e16da19ca85e4eebf46f1d70e5ff164"},
		{101618, 8412, "c5d2e2a06b3c80f8d14f31f2696fd501f78ddaafcc545174023c1c4dc24aff65"},
		{110030, 4890, "8cfe5efa08380dd637401a90f0cfffe32146af892ec8ac1700c3987674f683ca"},
		{114920, 6172, "e10409d9cccd8a85493db25f3746138dd43280792a9ac350aecfb27b4e8731c0"},
		{121092, 10346, "14657f2a558ba1337d5ec82dbf9d124a8461b68ab08f59cf06e75ff90e1d6074"},
		{131438, 10551, "89b727321d0a22368bb39ae0a3490180a52350ddb5a940e83f43d60e004f51f3"},
		{141989, 10307, "1316a6329261461000797e4fe3dccbee4697fdb266dd66f26c333daecc16fb9b"},
		{152296, 8428, "ac5f8431f7f9fb202ab8a9e8f1d5b819bd52cd5a82d9fbfe4377c9c3bec7f9b9"},
		{160724, 5113, "0567d2a4e8dc1e309cfc18f2b4e74725cbbd289e10487656d04c4d1606daa40e"},
		{165837, 2811, "8fa1782dc880dd3cccb7728e979568618dd1429d79ba8a12c7d6b3462f2e5487"},
		{168648, 15306, "54c0b2a43e41a5141ce23494946191d8826304e1a7b223825295678bbfbd7a21"},
		{183954, 13100, "0e58a010c8fbe0927e4545ebfdf35825cd8c95a9abd1e7f4aa1308c14e82e145"},
		{197054, 3726, "dfaf61d414b0b6f2b98209ec53683182cb01f0dbd4a8fbd7556fd4678bce26ff"},
		{200780, 9532, "420c398bb2ae551db541884bd7113ccf000bb4d2a003946439be24a6f0cb4239"},
		{210312, 8988, "ff1f86a0d9edb1505f97fb630c58e9ae1aaa4ca10b41784137a3374ddae380e5"},
		{219300, 10485, "d491c7b953d3c3ebb0ebd5185c94c25b313388b8376b61b03435cff0afcff6d4"},
		{229785, 9029, "0e5c066efa924a4ff38a10aa0df4d08696f2a46194f3770ca0b7ac05f0f94d35"},
		{238814, 3887, "74cf32431e218ff0c0b117155b782927ad08a2e38aa57d4eb26d8bd1c6c8fdcd"},
		{242701, 3007, "71604f4fc7e12fcdbb3cbd311f58bc74a092660cd259eeb52eb7f06c40bd7b4f"},
		{245708, 8239, "758e906df2f60f7fec7afcbc8da90fb4a41aeff100439497cf55cde1f86faa8b"},
		{253947, 8197, "1a182f650184448825f195219d2a2563a8901fd4eab75c735d278ef0239ce060"},
	}},
	{"small/zeros-100KiB", smallParams, func() []byte { return make([]byte, 100<<10) }, []golden{
		{0, 32768, "ac169ead597dac88b2d7223edd85c9895392532cfc7a3c5c29a3fbe3ccba37f2"},
		{32768, 32768, "ac169ead597dac88b2d7223edd85c9895392532cfc7a3c5c29a3fbe3ccba37f2"},
		{65536, 32768, "ac169ead597dac88b2d7223edd85c9895392532cfc7a3c5c29a3fbe3ccba37f2"},
		{98304, 4096, "b6fb73fc46938c981e2b0b4b1ef282adcfc89854d01bfe3972fdc4785b41b2c7"},
	}},
	{"fixed-64KiB/random-300000", chunker.Fixed(64 << 10), func() []byte { return randData(3, 300000) }, []golden{
		{0, 65536, "a950eca7b9cce99a60d1dac8466eb838e95b3ef485112881028f29dafd3f865d"},
		{65536, 65536, "977e4ea3f973a5fbf5174230e4547c6cee0391a0656352667be1137b1dc5b406"},
		{131072, 65536, "1d3d166307ec3d2cdfeea2e2bd6c96ef57cbedf22319dd3d793966760c1b2748"},
		{196608, 65536, "82778f38864169c070261d90a2443e6934db860a290e797a2962167c17722fd5"},
		{262144, 37856, "c2d085e845c0fdb7af9481a54e3db7048c5c7c44994a05d0fcbf59f086fadb4d"},
	}},
}

func TestGolden(t *testing.T) {
	var out strings.Builder
	for _, tc := range goldenCases {
		got := chunkAll(t, tc.data(), tc.params)
		if *printGolden {
			fmt.Fprintf(&out, "\t{%q, ..., []golden{\n", tc.name)
			for _, g := range got {
				fmt.Fprintf(&out, "\t\t{%d, %d, %q},\n", g.Start, g.Length, g.ID)
			}
			fmt.Fprintf(&out, "\t}},\n")
			continue
		}
		t.Run(tc.name, func(t *testing.T) {
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("chunks differ from the golden table (-want +got):\n%s", diff)
			}
		})
	}
	if *printGolden {
		t.Log("\n" + out.String())
	}
}

func chunkAll(t testing.TB, data []byte, p chunker.Params) []golden {
	t.Helper()
	c := chunker.New(bytes.NewReader(data), p)
	buf := make([]byte, p.Max)
	var got []golden
	for {
		ch, err := c.Next(buf)
		if errors.Is(err, io.EOF) {
			return got
		}
		if err != nil {
			t.Fatalf("Next: %v", err)
		}
		sum := blake3.Sum256(ch.Data)
		got = append(got, golden{ch.Start, ch.Length, hex.EncodeToString(sum[:])})
	}
}
