// Package nbd is raid5d's Network Block Device server: the fixed-newstyle handshake, option
// haggling and the transmission phase, serving any Device.
package nbd
