//go:build race

package ringapp_test

const raceEnabled = true
