package main

import "quota/internal/limiter"

const listenAddr = ":9400"

func main() {
	l := limiter.New(limiter.DefaultRate)
	serve(listenAddr, l)
}
