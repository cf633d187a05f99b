//go:build !race

package pluginmanager_test

// raceDetector says the tests run under the race detector, which makes
// the manager several times slower: the floods are made smaller then.
const raceDetector = false
