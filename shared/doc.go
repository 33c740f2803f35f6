// Package shared is the Provisioner contract and the SDK on both sides of it.
//
// (Design record to be written.)
package shared
