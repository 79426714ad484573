package kernels

import "math"

// float64 reference implementations of the layer kernels' forward passes,
// written for clarity, not speed. Tests compare the float32 kernels against
// them and differentiate them numerically for the gradient checks.

func refEncoder(tokens []int32, wte, wpe []float64, B, T, C int) []float64 {
	out := make([]float64, B*T*C)
	for b := 0; b < B; b++ {
		for t := 0; t < T; t++ {
			tok := int(tokens[b*T+t])
			for i := 0; i < C; i++ {
				out[(b*T+t)*C+i] = wte[tok*C+i] + wpe[t*C+i]
			}
		}
	}
	return out
}

func refLayerNorm(inp, w, bias []float64, N, C int) (out, mean, rstd []float64) {
	out = make([]float64, N*C)
	mean = make([]float64, N)
	rstd = make([]float64, N)
	for n := 0; n < N; n++ {
		x := inp[n*C : (n+1)*C]
		m := 0.0
		for _, v := range x {
			m += v
		}
		m /= float64(C)
		v := 0.0
		for _, xi := range x {
			v += (xi - m) * (xi - m)
		}
		v /= float64(C)
		rs := 1 / math.Sqrt(v+1e-5)
		for i, xi := range x {
			out[n*C+i] = (xi-m)*rs*w[i] + bias[i]
		}
		mean[n], rstd[n] = m, rs
	}
	return out, mean, rstd
}

// refMatmul: out (N,OC) = inp (N,C) @ w(OC,C)^T + bias; bias may be nil.
func refMatmul(inp, w, bias []float64, N, C, OC int) []float64 {
	out := make([]float64, N*OC)
	for n := 0; n < N; n++ {
		for o := 0; o < OC; o++ {
			s := 0.0
			if bias != nil {
				s = bias[o]
			}
			for i := 0; i < C; i++ {
				s += inp[n*C+i] * w[o*C+i]
			}
			out[n*OC+o] = s
		}
	}
	return out
}

// refAttention returns out (B,T,C), preatt and att (B,NH,T,T) with masked
// entries 0, as the CPU kernel writes them.
func refAttention(inp []float64, B, T, C, NH int) (out, preatt, att []float64) {
	hs := C / NH
	scale := 1 / math.Sqrt(float64(hs))
	out = make([]float64, B*T*C)
	preatt = make([]float64, B*NH*T*T)
	att = make([]float64, B*NH*T*T)
	for b := 0; b < B; b++ {
		for h := 0; h < NH; h++ {
			base := (b*NH + h) * T * T
			for t := 0; t < T; t++ {
				q := inp[(b*T+t)*3*C+h*hs:]
				mx := math.Inf(-1)
				for j := 0; j <= t; j++ {
					k := inp[(b*T+j)*3*C+C+h*hs:]
					s := 0.0
					for i := 0; i < hs; i++ {
						s += q[i] * k[i]
					}
					s *= scale
					preatt[base+t*T+j] = s
					mx = math.Max(mx, s)
				}
				sum := 0.0
				for j := 0; j <= t; j++ {
					e := math.Exp(preatt[base+t*T+j] - mx)
					att[base+t*T+j] = e
					sum += e
				}
				for j := 0; j <= t; j++ {
					att[base+t*T+j] /= sum
				}
				o := out[(b*T+t)*C+h*hs:]
				for j := 0; j <= t; j++ {
					v := inp[(b*T+j)*3*C+2*C+h*hs:]
					a := att[base+t*T+j]
					for i := 0; i < hs; i++ {
						o[i] += a * v[i]
					}
				}
			}
		}
	}
	return out, preatt, att
}

func refGelu(x []float64) []float64 {
	out := make([]float64, len(x))
	s := math.Sqrt(2 / math.Pi)
	for i, v := range x {
		out[i] = 0.5 * v * (1 + math.Tanh(s*(v+0.044715*v*v*v)))
	}
	return out
}

func refResidual(a, b []float64) []float64 {
	out := make([]float64, len(a))
	for i := range a {
		out[i] = a[i] + b[i]
	}
	return out
}

// refSoftmaxCE returns losses (N) and probs (N,Vp), padding columns 0.
func refSoftmaxCE(logits []float64, targets []int32, N, V, Vp int) (losses, probs []float64) {
	losses = make([]float64, N)
	probs = make([]float64, N*Vp)
	for n := 0; n < N; n++ {
		row := logits[n*Vp : n*Vp+V]
		mx := math.Inf(-1)
		for _, v := range row {
			mx = math.Max(mx, v)
		}
		sum := 0.0
		for _, v := range row {
			sum += math.Exp(v - mx)
		}
		for i, v := range row {
			probs[n*Vp+i] = math.Exp(v-mx) / sum
		}
		losses[n] = math.Log(sum) - (row[targets[n]] - mx)
	}
	return losses, probs
}

// refAdamW is one AdamW step in float64, in place.
func refAdamW(p, g, m, v []float64, lr, b1, b2, eps, wd float64, t int) {
	bc1 := 1 - math.Pow(b1, float64(t))
	bc2 := 1 - math.Pow(b2, float64(t))
	for i := range p {
		m[i] = b1*m[i] + (1-b1)*g[i]
		v[i] = b2*v[i] + (1-b2)*g[i]*g[i]
		p[i] -= lr * ((m[i]/bc1)/(math.Sqrt(v[i]/bc2)+eps) + wd*p[i])
	}
}
