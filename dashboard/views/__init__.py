"""Dashboard pages (not named pages/: Streamlit would take that folder for its legacy multipage mode): one thin script per page (run by `st.navigation` in `dashboard/app.py`)."""
