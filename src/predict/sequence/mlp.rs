//! One micro-step of an MLP: `layers` x (Linear + ReLU), the loss, and
//! backward layer by layer.

use super::Gen;

impl Gen<'_> {
    pub(super) fn mlp_micro_step(&mut self, layers: u64, hidden: u64) {
        let b = self.run.micro_batch;
        let d = &self.d;
        let (c, inb) = (d.compute, if d.amp { 4 } else { d.weight });
        let x = self.t.act(b * hidden * inb);
        let y = self.t.act(b * hidden * 4);
        self.fsdp_gather(None);
        let mut saved = vec![x];
        let mut casts = Vec::new();
        let mut input_cast = None;
        for l in 0..layers {
            casts.push(self.cast_weights(Some(l as u32)));
            if l == 0 && self.d.amp {
                input_cast = Some(self.t.act(b * hidden * c));
            }
            self.workspace(0);
            let lin = self.t.act(b * hidden * c);
            let relu = self.t.act(b * hidden * c);
            self.t.free(lin);
            saved.push(relu);
        }
        let out_f = (c != 4).then(|| self.t.act(b * hidden * 4));
        let loss = self.t.act(512);
        self.fsdp_end_forward();
        // backward
        let mut grad = self.t.act(b * hidden * 4);
        if let Some(o) = out_f {
            let g = self.t.act(b * hidden * c);
            self.t.free(grad);
            self.t.free(o);
            grad = g;
        }
        for l in (0..layers).rev() {
            self.workspace(1);
            let relu = saved.pop().expect("one saved output per layer");
            let g_lin = self.t.act(b * hidden * c);
            self.t.free(grad);
            self.grads_of_layer(Some(l as u32));
            for id in casts.pop().unwrap_or_default() {
                self.t.free(id);
            }
            let g_in = (l > 0).then(|| self.t.act(b * hidden * c));
            self.t.free(g_lin);
            self.t.free(relu);
            grad = g_in.unwrap_or(u32::MAX);
        }
        if let Some(ic) = input_cast {
            self.t.free(ic);
        }
        self.fsdp_post_backward(None);
        self.fsdp_end_backward();
        for id in [x, y, loss] {
            self.t.free(id);
        }
    }
}
