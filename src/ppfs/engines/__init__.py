"""MPC engines that run Step 2A on secret shares: MP-SPDZ (when installed) and MPyC."""
