package limiter

const DefaultRate = 120 // requests per minute

type Limiter struct{ rate int }

func New(rate int) *Limiter { return &Limiter{rate: rate} }
